#!/usr/bin/env python3
"""Writes tests/fixtures/agent_turns/output_sizes.txt: 500 output sizes
(tokens), one a line, in the order the benchmark and the tests replay
them. Deterministic (no randomness; run it again and the file does not
change): sorted sizes interpolate geometrically between anchor ranks so
that, by nearest rank, the median is 1,500, the p90 6,000, the p99 20,000
and the max 40,000 (the smallest 100); the order is a fixed shuffle
(a linear congruential generator seeded 37)."""
import pathlib

N = 500
# (0-based rank in the sorted list, size): nearest-rank p50 is rank 249,
# p90 rank 449, p99 rank 494.
ANCHORS = [(0, 100), (249, 1500), (449, 6000), (494, 20000), (499, 40000)]


def sorted_sizes():
    out = []
    for (r0, v0), (r1, v1) in zip(ANCHORS, ANCHORS[1:]):
        for r in range(r0, r1):
            out.append(round(v0 * (v1 / v0) ** ((r - r0) / (r1 - r0))))
    out.append(ANCHORS[-1][1])
    return out


def shuffled(xs):
    xs, state = list(xs), 37
    for i in range(len(xs) - 1, 0, -1):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        j = (state >> 33) % (i + 1)
        xs[i], xs[j] = xs[j], xs[i]
    return xs


if __name__ == "__main__":
    s = sorted_sizes()
    assert len(s) == N and s[249] == 1500 and s[449] == 6000 and s[494] == 20000 and s[-1] == 40000
    path = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/agent_turns/output_sizes.txt"
    path.write_text("".join(f"{x}\n" for x in shuffled(s)))
    print(f"wrote {path}")
