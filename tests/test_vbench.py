"""worldlab.vbench against VBench's own code (Vchitect/VBench, the `vbench` package).

The package pins transformers==4.33.2 and numpy<2, so it is not a dependency; these checks run wherever it can be
imported without its pins, e.g. `pip install --target DIR --no-deps vbench decord openai-clip omegaconf imageio
opencv-python-headless "setuptools<80"` and `PYTHONPATH=DIR pytest tests/test_vbench.py`. They skip elsewhere (CI).
Each check gives VBench's function and worldlab's the same mp4 and the same backbone (tiny random ones: no hub here)
and expects the same number: the formulas, the frame transforms and the decoding must all agree.
"""
import numpy as np
import pytest
import torch

from worldlab.core import read_video, write_video
from worldlab.corpus import plan_corpus, render_clip
from worldlab import vbench as wv

vb = pytest.importorskip('vbench', reason="VBench's own code is not importable (see the module docstring)")


@pytest.fixture(scope='module')
def clip(tmp_path_factory):
    "A corpus clip with camera motion and a moving subject, as an mp4, and its frames as decoded by worldlab."
    spec = next(s for s in plan_corpus(40, 0, seed=2) if s.dynamic)
    frames, _ = render_clip(spec, num_frames=17, H=96, W=160)
    path = tmp_path_factory.mktemp('vbench') / 'clip.mp4'
    write_video(path, frames)
    return str(path), read_video(path)[0]


@pytest.fixture(scope='module')
def tiny():
    return wv.tiny_vbench(seed=1)


def _same(ours, theirs, what, eps=1e-5):
    print(f"{what}: worldlab {ours:.8f}  VBench {theirs:.8f}  diff {ours - theirs:+.2e}")
    assert abs(ours - theirs) < eps, f"{what}: worldlab {ours} vs VBench {theirs}"


def test_decoding_agrees(clip):
    from vbench.utils import load_video
    path, frames = clip
    theirs = load_video(path)                                   # decord, [T,C,H,W] uint8
    assert torch.equal(wv.as_uint8_frames(frames), theirs), "PyAV and decord decode the mp4 differently"


def test_subject_consistency(clip, tiny):
    from vbench.subject_consistency import subject_consistency
    path, frames = clip
    dino = tiny.models['subject_consistency']
    _, rows = subject_consistency(dino, [path], 'cpu', False)
    _same(wv.subject_consistency(frames, dino), rows[0]['video_results'], 'subject_consistency')


def test_background_consistency(clip, tiny):
    from vbench.background_consistency import background_consistency
    path, frames = clip
    model = tiny.models['background_consistency']
    _, rows = background_consistency(model, None, [path], 'cpu', False)
    _same(wv.background_consistency(frames, model), rows[0]['video_results'], 'background_consistency')


def test_aesthetic_quality(clip, tiny):
    from vbench.aesthetic_quality import laion_aesthetic
    path, frames = clip
    clip_l14, head = tiny.models['aesthetic_quality']
    torch.nn.init.normal_(head.weight, std=1.0)                 # a head whose output varies with the embedding
    _, rows = laion_aesthetic(head, clip_l14, [path], 'cpu')
    _same(wv.aesthetic_quality(frames, clip_l14, head), rows[0]['video_results'], 'aesthetic_quality')


def test_imaging_quality(clip, tiny):
    from vbench.imaging_quality import technical_quality
    path, frames = clip
    iqa = tiny.models['imaging_quality']
    mean, _ = technical_quality(iqa, [path], 'cpu')
    _same(wv.imaging_quality(frames, iqa), mean, 'imaging_quality')


def test_imaging_quality_resizes_like_vbench(tmp_path, tiny):
    "A clip longer than 512 px: VBench's 'longer' resize must match worldlab's."
    from vbench.imaging_quality import technical_quality
    spec = plan_corpus(3, 0, seed=4)[0]
    frames, _ = render_clip(spec, num_frames=3, H=320, W=576)
    write_video(tmp_path / 'big.mp4', frames)
    frames = read_video(tmp_path / 'big.mp4')[0]
    iqa = tiny.models['imaging_quality']
    mean, _ = technical_quality(iqa, [str(tmp_path / 'big.mp4')], 'cpu')
    _same(wv.imaging_quality(frames, iqa), mean, 'imaging_quality at 576 px')


class _Interp(torch.nn.Module):
    "A stand-in for AMT with its call signature: a fixed, asymmetric mix of the two frames, and a tint."
    def forward(self, a, b, embt, scale_factor=1.0, eval=True):
        return {'imgt_pred': (0.3*a + 0.7*b + 0.02*torch.arange(3).view(1, 3, 1, 1)).clamp(0, 1)}


def test_motion_smoothness(clip):
    "VBench's MotionSmoothness (frame selection, padding, uint8 conversion, score) with the same interpolator."
    from vbench.motion_smoothness import MotionSmoothness
    path, frames = clip
    ms = MotionSmoothness.__new__(MotionSmoothness)
    ms.device, ms.niters, ms.model = 'cpu', 1, _Interp()
    ms.initialization()
    net = _Interp()

    def interpolate(a, b):
        x = [torch.as_tensor(f).permute(2, 0, 1)[None].float()/255.0 for f in (a, b)]
        mid = net(*x, None)['imgt_pred']
        return (mid*255.).squeeze(0).permute(1, 2, 0).numpy().clip(0, 255).astype(np.uint8)
    _same(wv.motion_smoothness(frames, interpolate), float(ms.motion_score(path)), 'motion_smoothness', eps=1e-9)


def test_amt_interpolator_matches_vbench_with_the_same_network(clip, tmp_path):
    "worldlab's AMT-S loader and wrapper against VBench's MotionSmoothness holding the same (randomly initialised) AMT-S."
    from pathlib import Path
    from omegaconf import OmegaConf
    from vbench.motion_smoothness import MotionSmoothness
    from vbench.third_party.amt.utils.build_utils import build_from_cfg
    cfg = Path(vb.__file__).parent/'third_party'/'amt'/'cfgs'/'AMT-S.yaml'
    torch.manual_seed(0)
    net = build_from_cfg(OmegaConf.load(cfg).network).eval()
    torch.save({'state_dict': net.state_dict()}, tmp_path/'amt-s-random.pth')
    path, frames = clip
    ms = MotionSmoothness.__new__(MotionSmoothness)
    ms.device, ms.niters, ms.model = 'cpu', 1, net
    ms.initialization()
    ours = wv.motion_smoothness(frames, wv.amt_interpolator(cfg, tmp_path/'amt-s-random.pth'))
    _same(ours, float(ms.motion_score(path)), 'motion_smoothness (random AMT-S)', eps=1e-6)
