// C++ under LD_PRELOAD: operator new/delete (aligned too) land in the allocator through libstdc++;
// a thread_local whose destructor allocates; static destructors that free at exit.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

struct alignas(256) Aligned {
    char data[1000];
};

struct AllocatesOnExit {
    std::vector<std::string> *v = nullptr;
    ~AllocatesOnExit() {
        // Allocate and free during thread teardown.
        std::string s(1000, 'x');
        std::vector<int> w(100, 7);
        delete v;
        if (s.size() != 1000 || w[99] != 7) std::abort();
    }
};

thread_local AllocatesOnExit tl;

struct Global {
    std::map<int, std::string> m;
    ~Global() { m.clear(); }
} global_object;

int main() {
    for (int i = 0; i < 1000; i++) global_object.m[i] = std::string(i % 100 + 1, 'g');
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; t++) {
        ts.emplace_back([t] {
            tl.v = new std::vector<std::string>(100, std::string(50, 'a' + t));
            for (int i = 0; i < 10000; i++) {
                auto a = std::make_unique<Aligned>();
                if (reinterpret_cast<uintptr_t>(a.get()) % 256 != 0) std::abort();
                std::string s(i % 300, 'z');
                (void)s;
            }
        });
    }
    for (auto &t : ts) t.join();
    int *arr = new int[1 << 20];
    arr[(1 << 20) - 1] = 5;
    delete[] arr;
    std::printf("cxx: 1 passed, 0 failed\n");
    return 0;
}
