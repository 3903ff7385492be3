#!/usr/bin/env python3
"""Builds tensor-lifetime datasets of published architectures for the memory planner.

Conventions as in ../shared/plan-data: batch 1, float32 activations, convolution + batch-norm +
activation fused into one op, ops in a plausible topological order, graph inputs and outputs included.
A tensor is live from the op that produces it (graph inputs: op 0) through the last op that reads it
(graph outputs: the last op). Writes NAME.csv and NAME.ops.tsv into tests/data/plan/.

Run: python3 scripts/gen-plan-data.py
"""
import math
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "plan")


class Graph:
    def __init__(self, name):
        self.name, self.ops, self.shapes, self.outputs = name, [], {}, []

    def input(self, name, shape):
        self.shapes[name] = shape
        self.inputs = [name]
        return name

    def op(self, kind, inputs, out, shape):
        assert out not in self.shapes, out
        self.shapes[out] = shape
        self.ops.append((kind, inputs, out))
        return out

    def write(self):
        first, last = {}, {}
        for t in self.inputs:
            first[t] = 0
        for i, (kind, ins, out) in enumerate(self.ops):
            first.setdefault(out, i)
            last.setdefault(out, i)
            for t in ins:
                last[t] = max(last.get(t, 0), i)
        end = len(self.ops) - 1
        for t in self.outputs:
            last[t] = end
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, self.name + ".csv"), "w") as f:
            f.write("tensor_id,size_bytes,first_op,last_op\n")
            for t in list(self.inputs) + [o for _, _, o in self.ops]:
                f.write(f"{t},{4 * math.prod(self.shapes[t])},{first[t]},{last[t]}\n")
        with open(os.path.join(OUT, self.name + ".ops.tsv"), "w") as f:
            f.write("op\tkind\tinputs\toutput\tshape\tdtype_bytes\n")
            for i, (kind, ins, out) in enumerate(self.ops):
                f.write(f"{i}\t{kind}\t{','.join(ins)}\t{out}\t{'x'.join(map(str, self.shapes[out]))}\t4\n")
        print(f"{self.name}: {len(self.inputs) + len(self.ops)} tensors, {len(self.ops)} ops")


def efficientnet_b0():
    g = Graph("efficientnet_b0_224")
    x = g.input("input", (224, 224, 3))
    x = g.op("conv3x3_s2+bn+swish", [x], "stem", (112, 112, 32))
    h, c = 112, 32
    # (expand ratio, kernel, stride, out channels, repeats): the EfficientNet-B0 table (Tan & Le, 2019)
    stages = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]
    b = 0
    for e, k, s, co, n in stages:
        for r in range(n):
            stride = s if r == 0 else 1
            p = f"b{b:02d}"
            inp, ce = x, c * e
            if e != 1:
                x = g.op("conv1x1+bn+swish", [x], p + "_expand", (h, h, ce))
            h2 = h // stride
            x = g.op(f"dw{k}x{k}_s{stride}+bn+swish", [x], p + "_dw", (h2, h2, ce))
            se = g.op("global_avgpool", [x], p + "_se_pool", (1, 1, ce))
            se = g.op("fc+swish", [se], p + "_se_reduce", (1, 1, max(1, c // 4)))
            se = g.op("fc+sigmoid", [se], p + "_se_expand", (1, 1, ce))
            x = g.op("mul", [x, se], p + "_se_scale", (h2, h2, ce))
            x = g.op("conv1x1+bn", [x], p + "_project", (h2, h2, co))
            if stride == 1 and c == co:
                x = g.op("add", [x, inp], p + "_add", (h2, h2, co))
            h, c, b = h2, co, b + 1
    x = g.op("conv1x1+bn+swish", [x], "head", (7, 7, 1280))
    x = g.op("global_avgpool", [x], "pool", (1, 1, 1280))
    g.outputs.append(g.op("fc", [x], "logits", (1000,)))
    g.write()


def yolov5s():
    g = Graph("yolov5s_640")
    n = [0]

    def conv(x, c, h, k=1, s=1, name=None):
        n[0] += 1
        return g.op(f"conv{k}x{k}_s{s}+bn+silu", [x], name or f"conv{n[0]}", (h // s, h // s, c)), h // s

    def c3(x, c, h, reps, shortcut, p):
        c_ = c // 2
        a, _ = conv(x, c_, h, name=p + "_cv1")
        b, _ = conv(x, c_, h, name=p + "_cv2")
        for i in range(reps):
            m1, _ = conv(a, c_, h, name=f"{p}_m{i}_cv1")
            m2, _ = conv(m1, c_, h, 3, name=f"{p}_m{i}_cv2")
            a = g.op("add", [a, m2], f"{p}_m{i}_add", (h, h, c_)) if shortcut else m2
        cat = g.op("concat", [a, b], p + "_cat", (h, h, 2 * c_))
        out, _ = conv(cat, c, h, name=p + "_cv3")
        return out

    x = g.input("input", (640, 640, 3))
    x, h = conv(x, 32, 640, 6, 2, "b0_conv")
    x, h = conv(x, 64, h, 3, 2, "b1_conv")
    x = c3(x, 64, h, 1, True, "b2_c3")
    x, h = conv(x, 128, h, 3, 2, "b3_conv")
    p3 = c3(x, 128, h, 2, True, "b4_c3")
    x, h = conv(p3, 256, h, 3, 2, "b5_conv")
    p4 = c3(x, 256, h, 3, True, "b6_c3")
    x, h = conv(p4, 512, h, 3, 2, "b7_conv")
    x = c3(x, 512, h, 1, True, "b8_c3")
    # SPPF
    s, _ = conv(x, 256, h, name="b9_sppf_cv1")
    y1 = g.op("maxpool5", [s], "b9_sppf_y1", (h, h, 256))
    y2 = g.op("maxpool5", [y1], "b9_sppf_y2", (h, h, 256))
    y3 = g.op("maxpool5", [y2], "b9_sppf_y3", (h, h, 256))
    cat = g.op("concat", [s, y1, y2, y3], "b9_sppf_cat", (h, h, 1024))
    x, _ = conv(cat, 512, h, name="b9_sppf_cv2")
    h10, _ = conv(x, 256, 20, name="h10_conv")
    up = g.op("upsample2x", [h10], "h11_up", (40, 40, 256))
    cat = g.op("concat", [up, p4], "h12_cat", (40, 40, 512))
    x = c3(cat, 256, 40, 1, False, "h13_c3")
    h14, _ = conv(x, 128, 40, name="h14_conv")
    up = g.op("upsample2x", [h14], "h15_up", (80, 80, 128))
    cat = g.op("concat", [up, p3], "h16_cat", (80, 80, 256))
    o3 = c3(cat, 128, 80, 1, False, "h17_c3")
    x, _ = conv(o3, 128, 80, 3, 2, "h18_conv")
    cat = g.op("concat", [x, h14], "h19_cat", (40, 40, 256))
    o4 = c3(cat, 256, 40, 1, False, "h20_c3")
    x, _ = conv(o4, 256, 40, 3, 2, "h21_conv")
    cat = g.op("concat", [x, h10], "h22_cat", (20, 20, 512))
    o5 = c3(cat, 512, 20, 1, False, "h23_c3")
    for name, t, hh in [("det_p3", o3, 80), ("det_p4", o4, 40), ("det_p5", o5, 20)]:
        g.outputs.append(g.op("conv1x1", [t], name, (hh, hh, 255)))
    g.write()


def vit_b16():
    g = Graph("vit_b16_224")
    d, t, heads, mlp = 768, 197, 12, 3072
    x = g.input("input", (224, 224, 3))
    x = g.op("conv16x16_s16", [x], "patch_embed", (196, d))
    x = g.op("concat_cls", [x], "tokens", (t, d))
    x = g.op("add_pos_embed", [x], "embed", (t, d))
    for i in range(12):
        p = f"l{i:02d}"
        ln = g.op("layernorm", [x], p + "_ln1", (t, d))
        qkv = g.op("matmul+bias", [ln], p + "_qkv", (t, 3 * d))
        q = g.op("split_q", [qkv], p + "_q", (heads, t, d // heads))
        k = g.op("split_k", [qkv], p + "_k", (heads, t, d // heads))
        v = g.op("split_v", [qkv], p + "_v", (heads, t, d // heads))
        sc = g.op("matmul_qk+scale", [q, k], p + "_scores", (heads, t, t))
        sm = g.op("softmax", [sc], p + "_attn", (heads, t, t))
        ctx = g.op("matmul_av", [sm, v], p + "_ctx", (t, d))
        pr = g.op("matmul+bias", [ctx], p + "_proj", (t, d))
        x1 = g.op("add", [pr, x], p + "_res1", (t, d))
        ln2 = g.op("layernorm", [x1], p + "_ln2", (t, d))
        f1 = g.op("matmul+bias+gelu", [ln2], p + "_fc1", (t, mlp))
        f2 = g.op("matmul+bias", [f1], p + "_fc2", (t, d))
        x = g.op("add", [f2, x1], p + "_res2", (t, d))
    x = g.op("layernorm", [x], "final_ln", (t, d))
    x = g.op("take_cls", [x], "cls", (d,))
    g.outputs.append(g.op("matmul+bias", [x], "logits", (1000,)))
    g.write()


if __name__ == "__main__":
    efficientnet_b0()
    yolov5s()
    vit_b16()
