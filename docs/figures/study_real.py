"""docs/figures/study-real.png from two `nebula-mq study compression --real` runs (seeds 0 and 1):
BLEU against the speed-up over the paper's baseline, with each seed's copy-the-source floor.

    python docs/figures/study_real.py 10.50,7.25 docs/figures/study-real.png
"""
import glob
import json
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

runs = {0: "run/study-real/study", 1: "run/study-real-seed1/study"}
copy_floors = {0: float(sys.argv[1].split(",")[0]), 1: float(sys.argv[1].split(",")[1])}
fig, ax = plt.subplots(figsize=(7.5, 4.6))
colors = {}
for seed, d in runs.items():
    for f in sorted(glob.glob(f"{d}/*.json")):
        r = json.load(open(f))
        if "chain" not in r or r.get("bleu") is None:
            continue
        c = colors.setdefault(r["chain"], f"C{len(colors)}")
        ax.scatter(r["speedup"], r["bleu"], color=c, marker="o" if seed == 0 else "^", s=50,
                   label=r["chain"] if seed == 0 else None)
for seed, floor in copy_floors.items():
    ax.axhline(floor, color="grey", ls="--" if seed == 0 else ":", lw=1)
    ax.text(0.99, floor, f"copy the source (seed {seed}'s test sentences)", color="grey", va="bottom", ha="right",
            fontsize=7, transform=ax.get_yaxis_transform())
ax.set_xlabel("speed-up per step over the paper's baseline (uncompressed, 1 micro-batch in flight)")
ax.set_ylabel("gettext test BLEU (300 sentences, case-insensitive)")
ax.set_title("Real data: ABNet 4+3 layers, 900 steps, link = 4x compute (o seed 0, ^ seed 1)", fontsize=9)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.01, 0.86))
ax.set_ylim(0, max(copy_floors.values()) * 1.15)
fig.savefig(sys.argv[2], dpi=110, bbox_inches="tight")
print("wrote", sys.argv[2])
