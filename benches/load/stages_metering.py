"""The cost of metering on a streamed chat, paired like the other features (stages_throughput.py):
the same 16-chunk OpenAI stream through `infer` (no `api`: bytes relayed, nothing read) and through
`metered` (api = "openai"), on the gateway and its twin on one core at once, CPU per request
compared. Three pairs per round:
- "on": the client sends no stream_options, as the OpenAI SDKs do, so the gateway adds
  include_usage upstream, scans the usage and strips what that added from every chunk;
- "asked": the client asks for include_usage itself: the gateway only scans (both sides get the
  usage chunk, so they relay the same bytes);
- "aa": `infer` against `infer`: the method's own spread, for reading the two above."""

from binaries import ROOT
from servers import STREAM_BODY, STREAM_USAGE_BODY
from stages_throughput import Throughput
import callgrind

# (name, base target, feature target, body both send)
METER_PAIRS = [
    ("on", "meter_off", "meter_on", STREAM_BODY),
    ("asked", "meter_off", "meter_on", STREAM_USAGE_BODY),
    ("aa", "meter_off", "meter_off", STREAM_BODY),
]


def lua(body):
    return f'wrk.method = "POST"\nwrk.body = \'{body}\'\nwrk.headers["Content-Type"] = "application/json"\n'


class Metering(Throughput):
    """Metering on vs off on a streamed chat (part of run.Bench); needs the twin running."""

    def metering_pairs(self):
        s = self.s
        self.check_streams()
        scripts = {}
        for name, _, _, body in METER_PAIRS:
            scripts[name] = self.work / f"stream-{name}.lua"
            scripts[name].write_text(lua(body))
        self.log(f"metering on a streamed chat ({self.facts['stream_events']} events): {s.meter_rounds} rounds x "
                 f"2 x {s.meter_seconds}s per pair, {' '.join(p[0] for p in METER_PAIRS)}")
        for r in range(1, s.meter_rounds + 1):
            for name, base, target, _ in METER_PAIRS:
                self.meter_pair(name, base, target, scripts[name])
            self.log(f"metering round {r}, CPU per request ÷ off: "
                     + " ".join(f"{p[0]}={self.raw.values(f'meter_{p[0]}')[-1]}" for p in METER_PAIRS))

    def meter_pair(self, name, base, target, script):
        """Both ways round (base on the gateway, feature on the twin, then the reverse): records
        the feature's CPU per request ÷ the base's (geometric mean of the two ways) and each
        side's CPU µs per request (mean of the two ways)."""
        gw, twin = (self.gateway, self.gw_port), (self.twin, self.twin_port)
        pair = self.pair_both_ways(base, target, self.s.meter_seconds, gw, twin, script)
        if pair is None:
            self.raw.record(f"meter_{name}", "nan")
            return
        ratio, base_us, us = pair
        self.raw.record(f"meter_{name}", "%.4f" % ratio)
        self.raw.record(f"meter_{name}_base_us", "%.2f" % base_us)
        self.raw.record(f"meter_{name}_us", "%.2f" % us)

    def metering_instructions(self):
        """Instructions per streamed chat, metering off / on / asked: deterministic, and a
        profile (bench-results/callgrind/stream-*.out) of where metering's cost goes."""
        self.log("instructions per streamed chat: benches/load/callgrind.py streams")
        callgrind.ensure_valgrind(self.log)
        figures = callgrind.measure(self.tools, ROOT / "bench-results" / "callgrind", self.s.cg_requests // 2,
                                    self.s.cg_warmup, self.log, streams=True)
        for name, value in figures.items():
            self.raw.record(name, value)
