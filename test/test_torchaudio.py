"""torchaudio on accel: its transforms, functional API and models against the CPU.

torchaudio's signal processing is code we did not write that leans on what models rarely do:
complex FFTs and their inverses (spectrograms, phase vocoder, Griffin-Lim), IIR filters run
sample by sample (torchaudio's lfilter loop operator, with a CPU kernel and a composite one:
accel runs the CPU kernel, see torch_accel/__init__.py), polyphase resampling, and its own C++
operators (rnnt_loss, forced_align: CPU kernels only, which accel runs on its own memory, as any
other library's operator with a CPU kernel, without the copying fallback). Each case runs on the
CPU and on accel from the same inputs; values and gradients must match the CPU's, and the CPU
fallback is forbidden. Tacotron2 is left out: its prenet applies dropout in evaluation too (a
random draw that differs between devices).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import hf_tasks
import pytest
import torch

torchaudio = pytest.importorskip("torchaudio")
import torchaudio.functional as F  # noqa: E402
import torchaudio.models as M  # noqa: E402
import torchaudio.transforms as T  # noqa: E402

ACCEL = torch.device("accel")
RATE = 8000

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _wave(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.3


def _check(cpu: Any, acc: Any, what: str, rtol: float, atol: float) -> None:
    if isinstance(cpu, torch.Tensor):
        assert acc.device.type == "accel", f"{what}: result on {acc.device}"
        torch.testing.assert_close(
            acc.cpu(), cpu, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
        )
    elif isinstance(cpu, (tuple, list)):
        for i, (c, a) in enumerate(zip(cpu, acc, strict=True)):
            _check(c, a, f"{what}[{i}]", rtol, atol)


# name: (function of the inputs, inputs, differentiable input positions)
class _Magnitude(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).abs()


FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]] = {
    "Spectrogram": (T.Spectrogram(n_fft=128), (_wave(2, 2000),), (0,)),
    "Spectrogram-complex": (T.Spectrogram(n_fft=128, power=None), (_wave(2, 2000),), ()),
    "MelSpectrogram": (T.MelSpectrogram(RATE, n_fft=256, n_mels=32), (_wave(2, 2000),), (0,)),
    "MFCC": (
        T.MFCC(RATE, n_mfcc=13, melkwargs={"n_fft": 256, "n_mels": 32}),
        (_wave(2, 2000),),
        (0,),
    ),
    "LFCC": (
        T.LFCC(RATE, n_filter=32, n_lfcc=13, speckwargs={"n_fft": 256}),
        (_wave(2, 2000),),
        (0,),
    ),
    "InverseSpectrogram": (
        lambda x: T.InverseSpectrogram(n_fft=128)(T.Spectrogram(n_fft=128, power=None)(x)),
        (_wave(2, 2000),),
        (0,),
    ),
    "GriffinLim": (
        lambda s: T.GriffinLim(n_fft=128, n_iter=4, rand_init=False)(s),
        (T.Spectrogram(n_fft=128)(_wave(1, 2000)),),
        (),
    ),
    # A module moved to accel, not built under torch.device(accel): in a process where
    # transformers first entered a device context while it patched torch.linspace
    # (meta_device_safe_creation_ops), PyTorch's cached set of factory functions holds the patch,
    # so torch.device contexts no longer place linspace's results (TimeStretch's buffer stayed on
    # the CPU after test_third_party.py; reproduced without accel: torch.empty inside a
    # torch.device("meta") context inside that patch, then linspace ignores torch.device("meta")).
    "TimeStretch": (
        _Magnitude(T.TimeStretch(n_freq=65, fixed_rate=1.3)),
        (T.Spectrogram(n_fft=128, power=None)(_wave(2, 2000)),),
        (),
    ),
    "Resample": (T.Resample(RATE, 5000), (_wave(2, 2000),), (0,)),
    "Resample-kaiser": (
        lambda x: F.resample(x, RATE, 11025, resampling_method="sinc_interp_kaiser"),
        (_wave(2, 2000),),
        (0,),
    ),
    "AmplitudeToDB": (T.AmplitudeToDB(), (_wave(2, 40, 30).abs() + 0.01,), (0,)),
    "ComputeDeltas": (T.ComputeDeltas(), (_wave(2, 20, 30),), (0,)),
    "SlidingWindowCmn": (T.SlidingWindowCmn(cmn_window=20), (_wave(2, 50, 13),), (0,)),
    "SpectralCentroid": (T.SpectralCentroid(RATE, n_fft=128), (_wave(2, 2000),), (0,)),
    "MuLaw": (lambda x: T.MuLawDecoding()(T.MuLawEncoding()(x)), (_wave(2, 500).clamp(-1, 1),), ()),
    "Preemphasis-Deemphasis": (
        lambda x: T.Deemphasis()(T.Preemphasis()(x)),
        (_wave(2, 500),),
        (0,),
    ),
    "lfilter": (
        lambda x: F.lfilter(x, torch.tensor([1.0, -0.5, 0.2]), torch.tensor([0.3, 0.2, 0.1])),
        (_wave(2, 400),),
        (0,),
    ),
    "filtfilt": (
        lambda x: F.filtfilt(x, torch.tensor([1.0, -0.4]), torch.tensor([0.5, 0.1])),
        (_wave(2, 400),),
        (0,),
    ),
    "biquads": (
        lambda x: F.bass_biquad(
            F.highpass_biquad(F.lowpass_biquad(x, RATE, 1500), RATE, 100), RATE, 3.0
        ),
        (_wave(2, 400),),
        (0,),
    ),
    "fftconvolve": (F.fftconvolve, (_wave(2, 300), _wave(2, 40, seed=1)), (0, 1)),
    "convolve": (F.convolve, (_wave(2, 300), _wave(2, 40, seed=1)), (0, 1)),
    "add_noise": (
        F.add_noise,
        (_wave(2, 300), _wave(2, 300, seed=1), torch.tensor([10.0, 3.0])),
        (0, 1),
    ),
    "speed": (lambda x: F.speed(x, RATE, 1.2)[0], (_wave(2, 800),), (0,)),
    # an octave: a 2:1 resampling (three semitones: 4 s on the CPU alone)
    "pitch_shift": (lambda x: F.pitch_shift(x, RATE, 12, n_fft=128), (_wave(1, 1000),), (0,)),
    "phase_vocoder": (
        lambda s: F.phase_vocoder(
            s, 0.8, torch.linspace(0, torch.pi * 64, 65, device=s.device)[..., None]
        ).abs(),  # the device given: see TimeStretch
        (T.Spectrogram(n_fft=128, power=None)(_wave(2, 2000)),),
        (),
    ),
    "detect_pitch_frequency": (lambda x: F.detect_pitch_frequency(x, RATE), (_wave(2, 4000),), ()),
    "loudness": (lambda x: F.loudness(x, RATE), (_wave(2, 8000),), (0,)),
    "flanger": (lambda x: F.flanger(x, RATE), (_wave(2, 500),), (0,)),
    "psd-mvdr": (
        lambda s, m: F.mvdr_weights_souden(F.psd(s, m), F.psd(s, 1 - m), 0),
        (
            torch.complex(_wave(4, 33, 20), _wave(4, 33, 20, seed=1)),
            torch.rand(33, 20, generator=torch.Generator().manual_seed(2)),
        ),
        (),
    ),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_torchaudio_functions_like_cpu(name: str, no_fallback: None) -> None:
    fn, inputs, grads = FUNCTIONS[name]
    fn_acc = copy.deepcopy(fn).to(ACCEL) if isinstance(fn, torch.nn.Module) else fn
    cpu_in = [
        x.clone().requires_grad_(i in grads) if isinstance(x, torch.Tensor) else x
        for i, x in enumerate(inputs)
    ]
    acc_in = [
        x.detach().to(ACCEL).requires_grad_(i in grads) if isinstance(x, torch.Tensor) else x
        for i, x in enumerate(cpu_in)
    ]
    if not isinstance(fn, torch.nn.Module):  # filter coefficients made inside the lambda
        with torch.device(ACCEL):
            got = fn(*acc_in)
    else:
        got = fn_acc(*acc_in)
    expected = fn(*cpu_in)
    _check(expected, got, name, rtol=1e-4, atol=1e-5)
    if grads:
        weight = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3))
        (expected * weight).sum().backward()
        (got * weight.to(ACCEL)).sum().backward()
        for i in grads:
            _check(
                cpu_in[i].grad,
                acc_in[i].grad,
                f"{name}: gradient of input {i}",
                rtol=1e-4,
                atol=1e-5,
            )


@pytest.mark.parametrize(
    "imports",
    ["import torchaudio, torch_accel", "import torch_accel, torchaudio", "import torchaudio"],
)
def test_lfilter_runs_its_cpu_kernel_on_accel_whatever_the_import_order(
    run_python, imports: str
) -> None:
    """torchaudio's IIR loop operator has a CPU kernel and a composite one (a few small
    operators per sample); accel runs the CPU kernel on its memory, registered once torchaudio
    has loaded its operators, also when torchaudio imports torch (and through its backend
    autoload torch_accel) before it has loaded them."""
    code = f"""{imports}
import torch, torch_accel
op = "torchaudio::_lfilter_core_loop"
print(torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1"))
print(torch_accel._C.is_initialized())  # registering starts nothing (forks stay safe)
"""
    proc = run_python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


def test_rnnt_loss_and_forced_align_like_cpu(no_fallback: None) -> None:
    """torchaudio's own C++ operators (CPU and CUDA kernels only)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 10, 5, 6, generator=gen)
    targets = torch.randint(1, 6, (2, 4), generator=gen, dtype=torch.int32)
    lengths = torch.tensor([10, 8], dtype=torch.int32)
    target_lengths = torch.tensor([4, 3], dtype=torch.int32)
    runs = []
    for device in ("cpu", ACCEL):
        x = logits.detach().to(device).requires_grad_()
        args = [t.to(device) for t in (targets, lengths, target_lengths)]
        loss = F.rnnt_loss(x, *args, blank=0)
        loss.backward()
        runs.append((loss, x.grad))
    _check(runs[0], runs[1], "rnnt_loss", rtol=1e-5, atol=1e-6)

    emission = torch.randn(1, 30, 6, generator=gen).log_softmax(-1)
    tokens = torch.tensor([[1, 3, 2, 5]], dtype=torch.int32)
    cpu = F.forced_align(emission, tokens, blank=0)
    acc = F.forced_align(emission.to(ACCEL), tokens.to(ACCEL), blank=0)
    _check(cpu, acc, "forced_align", rtol=0, atol=1e-6)


def _models() -> dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], tuple[Any, ...]]]]:
    wave = lambda n=4000: (_wave(2, n),)  # noqa: E731
    small_w2v = dict(
        extractor_mode="group_norm",
        extractor_conv_layer_config=[(16, 10, 5), (16, 3, 2), (16, 2, 2)],
        extractor_conv_bias=False,
        encoder_embed_dim=32,
        encoder_projection_dropout=0.0,
        encoder_pos_conv_kernel=16,
        encoder_pos_conv_groups=4,
        encoder_num_layers=2,
        encoder_num_heads=4,
        encoder_attention_dropout=0.0,
        encoder_ff_interm_features=64,
        encoder_ff_interm_dropout=0.0,
        encoder_dropout=0.0,
        encoder_layer_norm_first=False,
        encoder_layer_drop=0.0,
        aux_num_out=10,
    )
    wavlm = small_w2v | dict(encoder_num_buckets=16, encoder_max_distance=32)
    return {
        "wav2vec2": (lambda: M.wav2vec2_model(**small_w2v), wave),
        "wavlm": (lambda: M.wavlm_model(**wavlm), wave),
        "conformer": (
            lambda: M.Conformer(
                input_dim=16, num_heads=2, ffn_dim=32, num_layers=2, depthwise_conv_kernel_size=7
            ),
            lambda: (_wave(2, 20, 16), torch.tensor([20, 15])),
        ),
        "emformer_rnnt": (
            lambda: M.emformer_rnnt_model(
                input_dim=16,
                encoding_dim=16,
                num_symbols=12,
                segment_length=4,
                right_context_length=2,
                time_reduction_input_dim=16,
                time_reduction_stride=2,
                transformer_num_heads=2,
                transformer_ffn_dim=32,
                transformer_num_layers=2,
                transformer_dropout=0.0,
                transformer_activation="gelu",
                transformer_left_context_length=8,
                transformer_max_memory_size=0,
                transformer_weight_init_scale_strategy="depthwise",
                transformer_tanh_on_mem=True,
                symbol_embedding_dim=16,
                num_lstm_layers=1,
                lstm_layer_norm=True,
                lstm_layer_norm_epsilon=1e-5,
                lstm_dropout=0.0,
            ),
            lambda: (
                _wave(2, 22, 16),
                torch.tensor([22, 18]),
                torch.randint(0, 12, (2, 5), generator=torch.Generator().manual_seed(1)),
                torch.tensor([5, 4]),
            ),
        ),
        "conv_tasnet": (
            lambda: M.ConvTasNet(
                num_sources=2,
                enc_kernel_size=8,
                enc_num_feats=16,
                msk_kernel_size=3,
                msk_num_feats=8,
                msk_num_hidden_feats=16,
                msk_num_layers=2,
                msk_num_stacks=1,
            ),
            lambda: (_wave(2, 1, 800),),
        ),
        "hdemucs": (
            lambda: M.HDemucs(sources=["a", "b"], channels=8, growth=2, nfft=256, depth=4),
            lambda: (_wave(1, 2, 4096),),
        ),
        "wavernn": (
            lambda: M.WaveRNN(
                upsample_scales=[2, 2],
                n_classes=16,
                hop_length=4,
                n_res_block=1,
                n_rnn=16,
                n_fc=16,
                kernel_size=5,
                n_freq=8,
                n_hidden=8,
                n_output=8,
            ),
            lambda: (_wave(2, 1, 4 * 6), _wave(2, 1, 8, 10)),
        ),
        "squim_objective": (
            lambda: M.squim_objective_model(
                feat_dim=16,
                win_len=32,
                d_model=16,
                nhead=2,
                hidden_dim=16,
                num_blocks=1,
                rnn_type="LSTM",
                chunk_size=8,
            ),
            lambda: (_wave(2, 800),),
        ),
        "deepspeech": (
            lambda: M.DeepSpeech(n_feature=16, n_hidden=16, n_class=10),
            lambda: (_wave(2, 1, 12, 16),),
        ),
        "wav2letter": (
            lambda: M.Wav2Letter(num_classes=10, num_features=16, input_type="mfcc"),
            lambda: (_wave(2, 16, 40),),
        ),
    }


MODELS = _models()


@pytest.mark.parametrize("name", list(MODELS))
def test_torchaudio_models_forward_and_backward_like_cpu(name: str, no_fallback: None) -> None:
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    model = hf_tasks.without_randomness(make().train())  # the devices draw different numbers
    acc = copy.deepcopy(model).to(ACCEL)
    args = inputs()
    expected, got = model(*args), acc(*hf_tasks.to(args, ACCEL))
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731
    _check(first(expected), first(got), f"{name} output", rtol=1e-4, atol=1e-5)
    first(expected).square().mean().backward()
    first(got).square().mean().backward()
    largest = max(p.grad.abs().max() for p in model.parameters() if p.grad is not None)
    for (n, p), q in zip(model.named_parameters(), acc.parameters(), strict=True):
        if p.grad is not None:
            # against the largest gradient: biases before a normalization have ~0 gradients
            torch.testing.assert_close(
                q.grad.cpu(),
                p.grad,
                rtol=1e-4,
                atol=1e-5 * float(largest) + 1e-7,
                msg=lambda m, n=n: f"{name} gradient of {n}: {m}",
            )
