"""Fidelity: worldlab's `release` switches against independent transcriptions of the released code
(tests/release_ref.py), and the bugs found while comparing, each checked by what the reference does."""
import json, math, random
from pathlib import Path

import numpy as np
import pytest
import torch

import release_ref as ref


# --- WorldReward: voting, bench scoring, chunk records ------------------------------------------------------------------
def test_majority_of_no_votes_is_a_tie():
    from worldlab.verdicts import majority, vote, ChunkVerdict
    for votes in ([], ['A', 'B'], ['A', 'A', 'B'], ['Tie'], [None, 'B']):
        assert majority(votes) == ref.wr_majority([v for v in votes if v]), votes
    assert vote([ChunkVerdict([None]*4, None, None, None, None, None)]) == dict(action='tie', appearance='tie', motion='tie')


def _bench(rng, n=40):
    sides = ['left', 'right', 'tie']
    bench, preds = [], {}
    for i in range(n):
        lab = {a: rng.choice(sides + [None, 'absent']) for a in ('action', 'appearance', 'motion')}
        lab = {a: v for a, v in lab.items() if v != 'absent'}
        bench.append(dict(pair_id=f'p{i}', label=lab, trajectory_group='compound', style='photo'))
        preds[f'p{i}'] = {a: rng.choice(sides) for a in ('action', 'appearance', 'motion')}
    return bench, preds


def test_score_bench_skips_null_and_absent_labels():
    from worldlab.verdicts import score_bench
    rng = random.Random(3)
    for _ in range(5):
        bench, preds = _bench(rng)
        table, _ = score_bench({b['pair_id']: b for b in bench}, preds)
        want = ref.wr_evaluate(bench, preds)
        for a, (c, n, cn, nn) in want.items():
            assert table.loc['all', a] == round(100*c/n, 2)
            assert table.loc['all', f'{a} (non-tie)'] == round(100*cn/nn, 2)


def test_chunk_records_use_worldreward_names(tmp_path):
    "group_info.json with raw `action_labels` and normalised `action_texts` (WorldReward worldreward/render.py)."
    from worldlab.chunks import Pair, Side, render_pair
    from worldlab.core import write_video
    v = (torch.rand(9, 32, 48, 3)*255).byte()
    for n in ('a', 'b'): write_video(tmp_path/f'{n}.mp4', v, fps=8)
    from PIL import Image
    Image.fromarray(v[0].numpy()).save(tmp_path/'src.png')
    pair = Pair('demo', tmp_path/'src.png', 'a scene', ['forward', 'camera_l'], Side(tmp_path/'a.mp4'), Side(tmp_path/'b.mp4'),
                spans=dict(num_frames=9))
    render_pair(pair, tmp_path/'chunks')
    rec = json.loads((tmp_path/'chunks'/'demo'/'chunk_00'/'group_info.json').read_text())
    assert rec['action_labels'] == ['IDLE', 'forward', 'camera_l', 'PAD']
    assert rec['action_texts'][1] == 'Forward | IDLE' and rec['action_texts'][2].startswith('IDLE | ')


# --- training samples ---------------------------------------------------------------------------------------------------
def test_progress_sample_uses_the_camera_noise(tmp_path, monkeypatch):
    "The sample video of a camera-controlled run starts from the trainer's warped noise, not plain noise."
    import worldlab.sampler as S
    from worldlab.train import train, preset_params
    seen, real = [], S.sample
    def spy(policy, emb, x0, *a, **k):
        if k.get('noise_level') == 0.0: seen.append(x0.detach().clone())
        return real(policy, emb, x0, *a, **k)
    monkeypatch.setattr(S, 'sample', spy)
    prompts = tmp_path/'p.txt'; prompts.write_text('Camera pan right. A red cube on a chequered floor.\n')
    params = preset_params('tiny') | dict(height=64, width=64, num_frames=9, num_steps=2, group_size=2, prompts_per_batch=1,
                                          steps=1, sample_every=1, prompts=str(prompts), injection='init', noise_degradation=0.1)
    train(params, tmp_path/'run', progress=False)
    assert len(seen) == 1
    x = seen[0][0]                                         # [C,T,h,w]: a pan moves latent frame 1 sideways against frame 0
    corr = max(float(torch.corrcoef(torch.stack([x[:, 0].flatten(), torch.roll(x[:, 1], dx, dims=-1).flatten()]))[0, 1])
               for dx in range(-3, 4))
    assert corr > 0.4, corr                                # plain noise: each |corr| ~ 0.03 (1/sqrt(1024 values))


# --- the release preset, end to end on the tiny twin --------------------------------------------------------------------
CHEAP_RECON = {"depth_prior": "procedural", "stride": 4, "coarse_steps": 4, "fine_steps": 2, "batch": 2, "n_depths": 8,
               "track_iters": [2, 2, 1]}

def test_release_preset_runs_on_the_tiny_twin(tmp_path):
    "wan2.1-1.3b-release with the tiny Wan, CPU sizes and CPU reward models: its release math runs end to end."
    from worldlab.train import train, preset_params
    prompts = tmp_path/'p.txt'
    prompts.write_text('Camera orbit left, then push in, then pan right. A stone arch.\nCamera move right. A harbour.\n')
    params = preset_params('wan2.1-1.3b-release') | dict(
        model='tiny', device='cpu', dtype='fp32', height=32, width=32, num_frames=9, num_steps=4, guidance_scale=1.0,
        prompts_per_batch=1, steps=2, main_steps=1, dynamic_steps=1, prompts=str(prompts), recon='fit', lpips='random',
        rgen='standin', recon_opts=CHEAP_RECON, r3d_parts={'s_recon': 1, 's_traj': 1}, ema=0.0)
    hist = train(params, tmp_path/'run', progress=False)
    assert list(hist.phase) == ['main', 'dynamic']
    assert hist['reward/reward_3d'].notna().iloc[0] and hist['reward/reward_general'].notna().all()
    assert (hist.window_lo == 0).all() and (hist.window_hi == 4).all()
    cfg = json.loads((tmp_path/'run'/'config.json').read_text())
    assert (cfg['train']['sde_form'], cfg['run']['reward_form'], cfg['train']['adv_ddof']) == ('release', 'release', 0)
