#!/bin/sh
# A git workload for the LD_PRELOAD tests: creates a repository with many files and commits, then walks
# it. Dates and names are fixed, so hashes and output are deterministic. Usage: git_workload.sh DIR N
set -e
dir=$1
n=${2:-20}
export GIT_AUTHOR_NAME=edgepool GIT_AUTHOR_EMAIL=e@example.invalid GIT_COMMITTER_NAME=edgepool GIT_COMMITTER_EMAIL=e@example.invalid
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'
export GIT_CONFIG_NOSYSTEM=1 HOME="$dir"
mkdir -p "$dir/repo"
cd "$dir/repo"
git init -q -b main .
i=0
while [ "$i" -lt "$n" ]; do
    j=0
    while [ "$j" -lt 40 ]; do
        mkdir -p "d$((j % 8))"
        seq "$i" "$((i + j * 50))" > "d$((j % 8))/f$j.txt"
        j=$((j + 1))
    done
    git add -A
    git commit -q -m "commit $i"
    i=$((i + 1))
done
git log --stat --format='%H %s' | sha256sum
git rev-list --count HEAD
git gc -q
git fsck --full | sort | sha256sum
git log -p --format='%H' | wc -l
git grep -c 17 HEAD~3 | sort | sha256sum
