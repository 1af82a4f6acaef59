"""Source-filter synthesis: per-frame F0, a mel-cepstral envelope and aperiodicity -> waveform.

WORLD's excitation model (M. Morise, WORLD synthesis) written in torch: at every glottal pulse
(pulse times from the running phase of the F0 track; 500 pulses/s where unvoiced) a
minimum-phase response of the periodic share of the envelope, times sqrt(period), plus a segment
of white noise one period long filtered by the aperiodic share, are overlap-added. Everything a
pulse needs lies at or before it, so a stream emits sample n once the frame after n is known.

    params: f0 [T] Hz (0 = unvoiced), mcep [T, 25] (24-order mel-cepstrum, alpha 0.42, natural log
            amplitude), ap [T] (WORLD's coded aperiodicity, one band, dB); frame t centred on sample t * hop.
    SourceFilterSynth(...).synthesize(f0, mcep, ap) -> wav [T * hop]
"""

from __future__ import annotations

import math

import torch

MCEP_ORDER = 24  # 25 coefficients a frame
MCEP_ALPHA = 0.42  # all-pass warping of the mel-cepstrum at 16 kHz
AP_BAND_HZ = 3000.0  # WORLD's coded aperiodicity: one value per 3 kHz band
UNVOICED_PULSE_HZ = 500.0  # pulse rate of the noise where unvoiced (WORLD's default F0)
NOISE_TABLE = 1 << 16  # samples of the fixed white-noise table, indexed by absolute sample position


def mcep_matrix(n_fft: int, order: int = MCEP_ORDER, alpha: float = MCEP_ALPHA) -> torch.Tensor:
    """[n_fft / 2 + 1, order + 1]: log amplitude at each FFT bin = this @ mel-cepstrum.

    log |H(w)| = sum_m c_m cos(m w~), w~ the frequency seen through the all-pass z^-1 -> (z^-1 - a) / (1 - a z^-1).
    """
    w = torch.linspace(0, math.pi, n_fft // 2 + 1, dtype=torch.float64)
    warped = w + 2 * torch.atan2(alpha * torch.sin(w), 1 - alpha * torch.cos(w))
    return torch.cos(warped[:, None] * torch.arange(order + 1, dtype=torch.float64)).float()


def aperiodicity_db(coded: torch.Tensor, n_fft: int, sample_rate: int) -> torch.Tensor:
    """WORLD's decode_aperiodicity for one coded band: coded [...] dB -> [..., n_fft / 2 + 1] dB,
    linear in frequency through (0 Hz, -60 dB), (3 kHz, coded), (Nyquist, 0 dB)."""
    f = torch.arange(n_fft // 2 + 1, dtype=torch.float32) * sample_rate / n_fft
    nyquist = sample_rate / 2
    low = -60 + (coded[..., None] + 60) * (f / AP_BAND_HZ)
    high = coded[..., None] * (1 - (f - AP_BAND_HZ) / (nyquist - AP_BAND_HZ))
    return torch.where(f <= AP_BAND_HZ, low, high).clamp(max=-1e-3)


class SourceFilterSynth:
    """WORLD-style pulse + noise synthesis at `hop` samples a frame (see the module docstring)."""

    def __init__(self, sample_rate: int = 16000, hop: int = 320, n_fft: int = 1024,
                 unvoiced_rate: float = UNVOICED_PULSE_HZ):
        self.sample_rate, self.hop, self.n_fft, self.unvoiced_rate = sample_rate, hop, n_fft, unvoiced_rate
        self.mcep_to_log_amp = mcep_matrix(n_fft)
        generator = torch.Generator().manual_seed(1234)
        noise = torch.randn(NOISE_TABLE, generator=generator)
        self.noise = torch.cat([noise, noise[:n_fft]])  # a window may start anywhere in the table
        half = n_fft // 2
        bump = torch.hann_window(half + 2, periodic=False)[1:-1]
        # A pulse's DC is taken out in this shape (over its first n_fft / 2 samples), as a spectrum.
        self.dc_bump_spectrum = torch.fft.rfft(bump / bump.sum(), n_fft)
        self.ramp = torch.arange(n_fft)

    # ------------------------------------------------------------------ per-sample tracks

    def sample_tracks(self, f0: torch.Tensor, start: int, stop: int, frame0: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples [start, stop) -> (pulse rate Hz float64 [n], voiced bool [n]). f0 [T] Hz (0 =
        unvoiced) holds frames frame0 ... frame0 + T - 1; frames past the last hold it. Sample n at a
        frame centre depends on that frame alone."""
        n = torch.arange(start, stop, dtype=torch.float64)
        last = f0.shape[0] - 1
        t0 = (torch.div(n, self.hop, rounding_mode="floor").long() - frame0).clamp(min=0, max=last)
        t1 = (t0 + 1).clamp(max=last)
        w = (n / self.hop - frame0 - t0).clamp(min=0.0, max=1.0)
        a, b = f0[t0].double(), f0[t1].double()
        va, vb = a > 0, b > 0
        voiced = torch.where(w < 0.5, va, vb)
        a, b = torch.where(va, a, b), torch.where(vb, b, a)
        rate = torch.where(voiced, (1 - w) * a + w * b, torch.full_like(w, self.unvoiced_rate))
        return rate, voiced

    # ------------------------------------------------------------------ pulses

    def pulses(self, f0: torch.Tensor, start: int, stop: int, phase: float, frame0: int = 0) -> tuple[dict, float]:
        """Pulses in samples [start, stop), given the running phase (cycles) at sample start - 1.

        A pulse lies where the phase crosses a whole cycle between samples n and n + 1: it is placed
        at n with a fractional delay. -> ({index: int64 [P], shift: [P] in [0, 1), voiced: bool [P],
        period: [P] samples}, phase at sample stop - 1). Needs frames up to sample `stop`'s."""
        rate, voiced = self.sample_tracks(f0, start, stop + 1, frame0)
        cycles = phase + torch.cumsum(rate / self.sample_rate, 0)  # at samples start ... stop
        here, after = cycles[:-1], cycles[1:]
        at = (torch.floor(after) > torch.floor(here)).nonzero().squeeze(1)
        shift = (torch.floor(after[at]) - here[at]) / (after[at] - here[at])
        pulses = {"index": at + start, "shift": shift.float().clamp(max=1.0), "voiced": voiced[at],
                  "period": (self.sample_rate / rate[at]).float()}
        return pulses, float(here[-1])

    def responses(self, pulses: dict, mcep: torch.Tensor, ap: torch.Tensor, frame0: int = 0) -> torch.Tensor:
        """Each pulse's response: [P, n_fft] samples starting at its index. mcep [T, 25], ap [T] dB: frames
        frame0 ... frame0 + T - 1."""
        index = pulses["index"]
        P = index.shape[0]
        if P == 0:
            return torch.zeros(0, self.n_fft)
        pos = ((index.double() + pulses["shift"].double()) / self.hop - frame0).clamp(min=0)
        last = mcep.shape[0] - 1
        t0 = torch.floor(pos).long().clamp(max=last)
        t1 = (t0 + 1).clamp(max=last)
        w = (pos - t0).clamp(max=1.0).float()[:, None]
        mc = (1 - w) * mcep[t0] + w * mcep[t1]
        coded = ((1 - w) * ap[t0, None] + w * ap[t1, None]).squeeze(1)
        log_amp = mc @ self.mcep_to_log_amp.T  # [P, bins]
        ap_db = aperiodicity_db(coded, self.n_fft, self.sample_rate)
        voiced = pulses["voiced"]
        ratio = torch.where(voiced[:, None], torch.pow(10.0, ap_db / 10), torch.ones_like(ap_db))  # aperiodic share
        size = torch.round(pulses["period"]).long().clamp(min=1, max=self.n_fft)
        noise = self.noise[(index % NOISE_TABLE)[:, None] + self.ramp[None]]
        mask = self.ramp[None] < size[:, None]
        noise = noise * mask
        noise = (noise - noise.sum(1, keepdim=True) / size[:, None]) * mask
        spectrum = self.minimum_phase(log_amp + 0.5 * torch.log(ratio)) * torch.fft.rfft(noise)
        v = voiced.nonzero().squeeze(1)
        if len(v):  # the periodic share, at voiced pulses only
            bins = torch.arange(self.n_fft // 2 + 1, dtype=torch.float32)
            delay = torch.polar(pulses["period"][v, None].sqrt(),
                                (-2 * math.pi / self.n_fft) * bins * pulses["shift"][v, None])
            periodic = self.minimum_phase(log_amp[v] + 0.5 * torch.log1p(-ratio[v]).clamp(min=-30)) * delay
            spectrum[v] += periodic - periodic[:, :1] * self.dc_bump_spectrum
        return torch.fft.irfft(spectrum, self.n_fft)

    def minimum_phase(self, log_amp: torch.Tensor) -> torch.Tensor:
        """Log amplitude [P, bins] -> the minimum-phase spectrum with that magnitude, complex [P, bins]."""
        c = torch.fft.irfft(log_amp, self.n_fft)
        half = self.n_fft // 2
        folded = torch.cat([c[:, :1], 2 * c[:, 1:half], c[:, half:half + 1], torch.zeros_like(c[:, half + 1:])], 1)
        x = torch.fft.rfft(folded)
        return torch.polar(torch.exp(x.real), x.imag)

    # ------------------------------------------------------------------ whole signals

    def synthesize(self, f0: torch.Tensor, mcep: torch.Tensor, ap: torch.Tensor) -> torch.Tensor:
        """f0 [T], mcep [T, 25], ap [T] -> wav [T * hop] (the last frame held over its own hop)."""
        stream = SynthStream(self)
        return torch.cat([stream.push(f0, mcep, ap), stream.flush()])


class SynthStream:
    """`SourceFilterSynth` frame by frame: push(f0 [t], mcep [t, 25], ap [t]) -> the samples now final
    (every sample before the last pushed frame's centre); flush() -> the rest, up to T * hop.
    The concatenation equals `synthesize` of all frames (within float rounding)."""

    def __init__(self, synth: SourceFilterSynth):
        self.synth = synth
        self.frame0 = 0  # absolute index of the first frame held
        self.f0 = torch.zeros(0, dtype=torch.float64)
        self.mcep = torch.zeros(0, MCEP_ORDER + 1)
        self.ap = torch.zeros(0)
        self.done = 0  # samples emitted
        self.phase = 0.0
        self.pending = torch.zeros(synth.n_fft)  # tails of pulses already placed, from sample `done` on

    def push(self, f0: torch.Tensor, mcep: torch.Tensor, ap: torch.Tensor) -> torch.Tensor:
        self.f0 = torch.cat([self.f0, f0.double()])
        self.mcep = torch.cat([self.mcep, mcep.float()])
        self.ap = torch.cat([self.ap, ap.float()])
        return self._emit((self.frame0 + self.f0.shape[0] - 1) * self.synth.hop)

    def flush(self) -> torch.Tensor:
        return self._emit((self.frame0 + self.f0.shape[0]) * self.synth.hop)

    def _emit(self, stop: int) -> torch.Tensor:
        start, s = self.done, self.synth
        if stop <= start or not self.f0.shape[0]:
            return torch.zeros(0)
        pulses, self.phase = s.pulses(self.f0, start, stop, self.phase, self.frame0)
        out = torch.zeros(stop - start + s.n_fft)
        out[: s.n_fft] += self.pending
        responses = s.responses(pulses, self.mcep, self.ap, self.frame0)
        if responses.shape[0]:
            where = (pulses["index"] - start)[:, None] + s.ramp[None]
            out.index_add_(0, where.reshape(-1), responses.reshape(-1))
        self.pending = out[stop - start:].clone()
        self.done = stop
        drop = max(0, stop // s.hop - 1 - self.frame0)  # frames no later sample needs
        if drop:
            self.frame0 += drop
            self.f0, self.mcep, self.ap = self.f0[drop:], self.mcep[drop:], self.ap[drop:]
        return out[: stop - start]


# ----------------------------------------------------------------------------- analysis

CHEAPTRICK_Q1 = -0.15  # WORLD's spectral recovery parameter
ANALYSIS_HALF_WINDOW = 319  # samples each side of a frame centre: the window never reaches the next frame
UNVOICED_ANALYSIS_F0 = 500.0  # CheapTrick's F0 where unvoiced (WORLD's kDefaultF0)


def _interp_bins(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x [T, N] sampled at fractional bin positions pos [T, M] (linear, clamped to the ends)."""
    pos = pos.clamp(0, x.shape[1] - 1)
    lo = pos.floor().long().clamp(max=x.shape[1] - 2)
    w = pos - lo
    return (1 - w) * x.gather(1, lo) + w * x.gather(1, lo + 1)


def cheaptrick(wav: torch.Tensor, f0: torch.Tensor, hop: int = 320, sample_rate: int = 16000,
               n_fft: int = 1024) -> torch.Tensor:
    """WORLD's CheapTrick spectral envelope, vectorised: wav [S] (zeros outside it), f0 [T] Hz (0 =
    unvoiced) at frames centred on t * hop -> log power envelope [T, n_fft / 2 + 1] (natural log).

    F0-adaptive Hann window of 3 periods (at most 2 * ANALYSIS_HALF_WINDOW + 1 samples), power spectrum,
    DC correction, rectangular smoothing over 2 F0 / 3 Hz, cepstral liftering with recovery (q1 = -0.15)."""
    T, bins, half = f0.shape[0], n_fft // 2 + 1, ANALYSIS_HALF_WINDOW
    f0 = torch.where(f0 > 0, f0.double(), torch.full_like(f0.double(), UNVOICED_ANALYSIS_F0))
    x = torch.nn.functional.pad(wav.double(), (half, max(0, T * hop + half - wav.shape[0])))
    frames = x.unfold(0, 2 * half + 1, hop)[:T]  # [T, 2 * half + 1], frame t centred on t * hop
    n = torch.arange(-half, half + 1, dtype=torch.float64)
    reach = torch.round(1.5 * sample_rate / f0).clamp(max=half)  # half window length
    window = (0.5 * torch.cos(math.pi * n[None] * f0[:, None] / (1.5 * sample_rate)) + 0.5) * (n[None].abs() <= reach[:, None])
    window = window / window.pow(2).sum(1, keepdim=True).sqrt()
    seg = frames * window
    seg = seg - window * (seg.sum(1, keepdim=True) / window.sum(1, keepdim=True))
    power = torch.fft.rfft(seg, n_fft).abs().pow(2)  # [T, bins]
    df = sample_rate / n_fft
    k = torch.arange(bins, dtype=torch.float64)
    # DC correction: below F0, add the spectrum mirrored about F0
    replica = _interp_bins(power, (f0[:, None] - k[None] * df) / df)
    power = power + torch.where(k[None] < 1 + torch.floor(f0[:, None] / df), replica, torch.zeros_like(power))
    # rectangular smoothing of width 2 F0 / 3 on the spectrum mirrored at both ends
    edge = int(2 * 550.0 / 3 / df) + 2
    mirrored = torch.cat([power[:, 1:edge + 1].flip(1), power, power[:, -edge - 1:-1].flip(1)], 1)
    cum = torch.cat([torch.zeros(T, 1, dtype=torch.float64), torch.cumsum(mirrored, 1) * df], 1)  # at bin edges
    width = 2 * f0[:, None] / 3
    at = lambda f: (f / df + edge + 0.5)  # noqa: E731 - bin-edge index of frequency f
    power = (_interp_bins(cum, at(k[None] * df + width / 2)) - _interp_bins(cum, at(k[None] * df - width / 2))) / width
    power = power + 2.220446049250313e-16
    # cepstral smoothing and recovery
    cep = torch.fft.irfft(torch.log(power), n_fft)  # [T, n_fft], symmetric
    q = torch.arange(n_fft, dtype=torch.float64)
    q = torch.minimum(q, n_fft - q) / sample_rate
    arg = math.pi * f0[:, None] * q[None]
    smoothing = torch.where(q[None] > 0, torch.sin(arg) / arg.clamp(min=1e-12), torch.ones_like(arg))
    recovery = (1 - 2 * CHEAPTRICK_Q1) + 2 * CHEAPTRICK_Q1 * torch.cos(2 * arg)
    return torch.fft.rfft(cep * smoothing * recovery).real.float()


def mcep_fit_matrix(n_fft: int = 1024, order: int = MCEP_ORDER, alpha: float = MCEP_ALPHA) -> torch.Tensor:
    """[order + 1, n_fft / 2 + 1]: mel-cepstrum = this @ log amplitude, the least-squares fit of
    `mcep_matrix` weighted by the warped frequency's density (each warped band counts alike)."""
    m = mcep_matrix(n_fft, order, alpha).double()
    w = torch.linspace(0, math.pi, n_fft // 2 + 1, dtype=torch.float64)
    density = (1 - alpha ** 2) / (1 - 2 * alpha * torch.cos(w) + alpha ** 2)  # d(warped) / d(w)
    weighted = m * density[:, None]
    return torch.linalg.solve(m.T @ weighted, weighted.T).float()
