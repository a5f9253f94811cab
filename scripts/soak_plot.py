"""Draws a soak's CSV (see scripts/soak-plot.sh) as a PNG.

Usage: soak_plot.py CSV PNG [TITLE]

Three panels over the run's minutes: the serving process's RSS; its open file descriptors and
sockets; its TCP connections (clients, upstreams and stores, other states such as CLOSE_WAIT).
A vertical line marks each fault where it started (the CSV's `event` column, `name@seconds`).
"""

import csv
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

COLOURS = {
    "upgrade": "tab:red",
    "revoke": "tab:purple",
    "postgres": "tab:blue",
    "replica": "tab:orange",
    "redis": "tab:green",
    "jwks": "tab:brown",
}


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "Portcullis soak"
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{source}: no samples")
    minutes = [float(r["t_s"]) / 60 for r in rows]

    def series(name: str) -> list[float]:
        return [float(r[name]) for r in rows]

    fig, (rss, fds, tcp) = plt.subplots(3, 1, sharex=True, figsize=(11, 8.5))
    rss.plot(minutes, [v / 1024 for v in series("rss_kb")], color="black")
    rss.set_ylabel("RSS (MiB)")
    rss.set_ylim(bottom=0)
    fds.plot(minutes, series("fds"), label="open fds")
    fds.plot(minutes, series("sockets"), label="sockets")
    fds.set_ylabel("descriptors")
    fds.set_ylim(bottom=0)
    tcp.plot(minutes, series("tcp_in"), label="from clients")
    tcp.plot(minutes, series("tcp_out"), label="to replicas, stores, IdP")
    tcp.plot(minutes, series("tcp_other"), label="other states (CLOSE_WAIT…)")
    tcp.set_ylabel("TCP connections")
    tcp.set_xlabel("minutes")
    tcp.set_ylim(bottom=0)

    marked = set()
    for r in rows:
        for event in filter(None, r["event"].split(" ")):
            name, _, at = event.partition("@")
            colour = COLOURS.get(name, "grey")
            for ax in (rss, fds, tcp):
                ax.axvline(float(at) / 60, color=colour, alpha=0.35, linewidth=1)
            if name not in marked:
                marked.add(name)
                rss.plot([], [], color=colour, alpha=0.6, label=name)
    rss.legend(loc="lower right", fontsize="small", ncol=len(marked) or 1)
    fds.legend(loc="lower right", fontsize="small")
    tcp.legend(loc="upper right", fontsize="small")
    fig.suptitle("\n".join(textwrap.wrap(title, 130)), fontsize="small")
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    print(f"soak-plot: wrote {target}")


if __name__ == "__main__":
    main()
