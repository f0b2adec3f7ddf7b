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
    from worldlab.config import resolve
    from worldlab.train import train
    seen, real = [], S.sample
    def spy(policy, emb, x0, *a, **k):
        if k.get('noise_level') == 0.0: seen.append(x0.detach().clone())
        return real(policy, emb, x0, *a, **k)
    monkeypatch.setattr(S, 'sample', spy)
    prompts = tmp_path/'p.txt'; prompts.write_text('Camera pan right. A red cube on a chequered floor.\n')
    params = resolve('tiny', dict(height=64, width=64, num_frames=9, num_steps=2, group_size=2, prompts_per_batch=1,
                                 steps=1, sample_every=1, prompts=str(prompts), injection='init', noise_degradation=0.1))
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
    from worldlab.config import resolve
    from worldlab.train import train
    prompts = tmp_path/'p.txt'
    prompts.write_text('Camera orbit left, then push in, then pan right. A stone arch.\nCamera move right. A harbour.\n')
    params = resolve('wan2.1-1.3b-release', dict(
        model='tiny', device='cpu', dtype='fp32', height=32, width=32, num_frames=9, num_steps=4, guidance_scale=1.0,
        prompts_per_batch=1, steps=2, main_steps=1, dynamic_steps=1, prompts=str(prompts), recon='fit', lpips='random',
        rgen='standin', recon_opts=CHEAP_RECON, r3d_parts={'s_recon': 1, 's_traj': 1}, ema=0.0))
    hist = train(params, tmp_path/'run', progress=False)
    assert list(hist.phase) == ['main', 'dynamic']
    assert hist['reward/reward_3d'].notna().iloc[0] and hist['reward/reward_general'].notna().all()
    assert (hist.window_lo == 0).all() and (hist.window_hi == 4).all()
    cfg = json.loads((tmp_path/'run'/'config.json').read_text())
    assert (cfg['train']['sde_form'], cfg['run']['reward_form'], cfg['train']['adv_ddof']) == ('release', 'release', 0)


# --- Flow-GRPO math: the Wan step, advantages, the loss -----------------------------------------------------------------
def test_release_step_matches_the_release():
    from worldlab.sampler import release_step
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        v, x, nxt = (torch.randn(3, 4, 2, 5, 5, generator=g) for _ in range(3))
        s, s1 = sorted(torch.rand(2, generator=g).tolist(), reverse=True)
        smax, smin = 0.999999, float(torch.rand(1, generator=g))*0.01
        lp, mean, std = release_step(v, x, s, s1, smax, smin, nxt)
        lp_r, mean_r, std_r = ref.sde_logprob(v.numpy(), x.numpy(), nxt.numpy(), s, s1, smax, smin)
        np.testing.assert_allclose(lp.numpy(), lp_r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mean.numpy(), mean_r, rtol=1e-5, atol=1e-6)
        assert abs(std - std_r) < 1e-9


def test_release_rollout_is_unipc_and_rescored_by_the_release_formula():
    "Each stored sample is a UniPC step of the stored latents; its stored log-prob is the release's formula."
    from diffusers import UniPCMultistepScheduler
    from worldlab.policy import WanPolicy
    from worldlab.sampler import sample
    pol = WanPolicy.tiny(seed=0)
    emb = pol.encode(['camera push in a red house']*2)
    x0 = torch.randn(2, *pol.latent_shape(9, 32, 32), generator=torch.Generator().manual_seed(0))
    roll = sample(pol, emb, x0, num_steps=5, sde_form='release', decode=False)
    u = UniPCMultistepScheduler(prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=3.0)
    u.set_timesteps(5)
    x = x0
    for i, t in enumerate(u.timesteps):
        with torch.no_grad(): v = pol.velocity(x, t, emb)
        nxt = u.step(v, t, x, return_dict=False)[0]
        torch.testing.assert_close(roll.samples[:, i], nxt, rtol=1e-5, atol=1e-5)
        lp, *_ = ref.sde_logprob(v.numpy(), x.numpy(), nxt.numpy(), float(u.sigmas[i]), float(u.sigmas[i + 1]),
                                 float(u.sigmas[0]), float(u.sigmas[-1]))
        np.testing.assert_allclose(roll.logps[:, i].numpy(), lp, rtol=1e-4, atol=1e-4)
        x = nxt


@pytest.mark.parametrize('seed', range(4))
def test_advantages_match_the_release(seed):
    from worldlab.grpo import group_advantages
    rng = np.random.default_rng(seed)
    groups = [f'p{i}' for i in range(5) for _ in range(4)]
    r = rng.normal(size=20)
    r[4:8] = 0.3                                                        # a zero-std group
    def ours(**kw):
        out = group_advantages(torch.tensor(r), groups, ddof=0, zero_std='keep', clip=1e9, **kw)
        assert out['mask'].all()
        return out['advantages'].double().numpy()
    np.testing.assert_allclose(ours(), ref.advantages(groups, r), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours(per_prompt_std=False), ref.advantages(groups, r, global_std=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours(per_prompt_std=False, mean='batch'), ref.advantages(groups, r, per_prompt=False), rtol=1e-5, atol=1e-6)
    G = 4                                                               # worldlab's default: smaller by sqrt((G-1)/G)
    a1 = group_advantages(torch.tensor(r), groups, clip=1e9)['advantages'].double().numpy()
    np.testing.assert_allclose(a1[:4], ref.advantages(groups, r)[:4]*math.sqrt((G - 1)/G), rtol=1e-3)


def test_loss_with_kept_zero_std_groups_matches_the_release():
    from worldlab.grpo import group_advantages, grpo_loss, kl_to_reference
    rng = np.random.default_rng(1)
    groups = ['a']*4 + ['b']*4
    r = np.r_[rng.normal(size=4), np.full(4, 0.5)]
    A = group_advantages(torch.tensor(r), groups, ddof=0, zero_std='keep')
    logp, logp_old = torch.tensor(rng.normal(size=8)*1e-3), torch.tensor(rng.normal(size=8)*1e-3)
    mean, mean_ref = torch.tensor(rng.normal(size=(8, 2, 3))), torch.tensor(rng.normal(size=(8, 2, 3)))
    std_dev_t, sqrt_dt = 0.6, 0.14
    loss, _ = grpo_loss(logp, logp_old, A['advantages'].double(), A['mask'], 1e-3, kl_to_reference(mean, mean_ref, std_dev_t*sqrt_dt), 0.004)
    want = ref.grpo_loss(logp.numpy(), logp_old.numpy(), ref.advantages(groups, r), 1e-3, 5.0, mean.numpy(), mean_ref.numpy(),
                         std_dev_t, sqrt_dt, 0.004)
    assert abs(float(loss) - want) < 1e-6*max(1, abs(want))
    masked, _ = grpo_loss(logp, logp_old, A['advantages'].double(), torch.tensor([True]*4 + [False]*4), 1e-3,
                          kl_to_reference(mean, mean_ref, std_dev_t*sqrt_dt), 0.004)
    assert abs(float(masked) - want) > 1e-3                             # worldlab's default masks group b out of both terms


# --- camera ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('names,F', [(['push_in'], 17), (['orbit_left'], 81), (['orbit_right', 'move_right', 'pan_left'], 81),
                                     (['push_in', 'pan_right', 'move_left'], 9), (['pull_out', 'orbit_left'], 17)])
def test_release_chains_match_the_release(names, F):
    from worldlab.camera import chain_trajectory
    T = ref.chain(names, F)
    T = T[ref.select(len(T), F)]
    T[:, :3, 3] = (T[:, :3, 3] - T[0, :3, 3])/1000.0                    # its start offset and units removed
    ours = chain_trajectory(names, F, timing='release', orbit='release').c2w.numpy()
    np.testing.assert_allclose(ours, T, atol=2e-5)                      # its six significant digits


# --- S_traj -----------------------------------------------------------------------------------------------------------------
def _perfect(names, noise, seed=0):
    T = ref.chain(names, 81)
    T81 = T[ref.select(len(T), 81)]
    est = T81.copy(); est[:, :3, 3] = (est[:, :3, 3] - T81[0, :3, 3])/1000.0
    est[:, :3, 3] += np.random.default_rng(seed).normal(0, noise, (81, 3))
    return T, est

@pytest.mark.parametrize('names,noise,tol', [(['pan_left'], 0, 1e-3), (['push_in'], 0, 1e-3), (['move_left'], 0.002, 1e-3),
                                             (['fixed'], 0.002, 1e-3), (['orbit_left'], 0, 1e-3), (['push_in', 'pan_right'], 0, 1e-3),
                                             (['orbit_left'], 0.002, 5e-3), (['orbit_right', 'move_right', 'pan_left'], 0.002, 5e-3)])
def test_s_traj_release_alignment_matches_the_release(names, noise, tol):
    "Noise-free estimates and collinear fallbacks exactly; noisy ones up to the release's unseeded RANSAC."
    from worldlab.camera import chain_trajectory
    from worldlab.metrics import trajectory_score
    T, est = _perfect(names, noise)
    want, winfo = ref.camera_motion_score(est, T, seed=0)
    got, info = trajectory_score(torch.tensor(est), chain_trajectory(names, 81, timing='release', orbit='release'), 'release', align='release')
    assert abs(got - want) < tol, (got, want, info, winfo)
    assert info['alignment'].startswith('not aligned') == winfo['alignment'].startswith('not aligned')


def test_s_traj_fallback_effect():
    "A perfect push-in video: the release's fallback scores it 0.52, worldlab's alignment 1."
    from worldlab.camera import chain_trajectory
    from worldlab.metrics import trajectory_score
    T, est = _perfect(['push_in'], 0)
    cmd = chain_trajectory(['push_in'], 81, timing='release')
    assert abs(trajectory_score(torch.tensor(est), cmd, 'release', align='release')[0] - 0.52) < 0.01
    assert trajectory_score(torch.tensor(est), cmd, 'release')[0] > 0.999


# --- S_recon, R_gen, S_meta -----------------------------------------------------------------------------------------------
class _Rec:
    "A perfect reconstruction of a synthetic scene: any camera renders a pattern shifted by its centre."
    ok, info = True, {}
    def __init__(self, c2w): self.c2w = c2w
    def render(self, c2w):
        x = torch.linspace(0, 1, 32, dtype=torch.float64)
        img = [0.5 + 0.4*torch.sin(12*x[None, :] + 40*P[2, 3] + 20*P[0, 3] + 0*x[:, None]) for P in c2w]
        return torch.stack(img)[:, None].expand(-1, 3, -1, -1).float()
    def rerender(self): return self.render(self.c2w)

def _eased_lerp_path(c2w):
    "The release's interpolation for cameras that keep their orientation: eased lerp of the centres."
    il, t = ref.inter_len(len(c2w)), ref.eased(ref.inter_len(len(c2w)))
    out = []
    for i in range(len(c2w) - 1):
        seg = np.repeat(c2w[i][None], il, 0)
        seg[:, :3, 3] = c2w[i, :3, 3] + t[:, None]*(c2w[i + 1, :3, 3] - c2w[i, :3, 3])
        out.append(seg if i == 0 else seg[1:])
    return ref.stabilize(np.concatenate(out), 50)

@pytest.mark.parametrize('F', [17, 81])
def test_s_recon_release_path_matches_the_release(F):
    from worldlab.camera import chain_trajectory
    from worldlab.metrics import load_lpips
    from worldlab.rewards import s_recon, release_render_path
    c2w = chain_trajectory(['push_in', 'move_left'], F).c2w
    np.testing.assert_allclose(release_render_path(c2w).numpy(), _eased_lerp_path(c2w.numpy()), atol=1e-9)
    rec, lp = _Rec(c2w), load_lpips('random')
    video = rec.rerender()
    want = ref.s_recon(rec.render(torch.tensor(_eased_lerp_path(c2w.numpy()))), video, lambda a, b: lp(a, b).detach())
    got, _ = s_recon(video, rec, lp, path='release')
    assert abs(got - want) < 1e-5
    assert s_recon(video, rec, lp)[0] == 1.0 and got < 1.0            # worldlab compares each frame with its own view


def test_rgen_release_frame_matches_the_release():
    from PIL import Image
    from worldlab.rewards import r_gen_reward
    seen = []
    def scorer(images, prompts): seen.append([np.asarray(i) for i in images]); return [0.0]*len(images)
    scorer.label = 'probe'
    videos = torch.rand(3, 9, 3, 8, 8)
    for seed in range(3):
        seen.clear()
        r_gen_reward(scorer, frames='random', seed=seed)(videos, ['p']*3, [{}]*3)
        t, frames = ref.rgen_frame(videos.permute(0, 1, 3, 4, 2).numpy(), random.Random(seed))
        assert [len(s) for s in seen] == [1, 1, 1]
        for s, f in zip(seen, frames): np.testing.assert_array_equal(s[0], f)
    seen.clear()
    r_gen_reward(scorer, frames='random', jpeg=True, seed=0)(videos, ['p']*3, [{}]*3)
    t, frames = ref.rgen_frame(videos.permute(0, 1, 3, 4, 2).numpy(), random.Random(0))
    import io
    buf = io.BytesIO(); Image.fromarray(frames[0]).save(buf, format='JPEG')
    np.testing.assert_array_equal(seen[0][0], np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert('RGB')))


def test_meta_expectation_matches_the_release():
    from worldlab.judge import JudgeReply
    from worldlab.rewards import parse_meta_score
    rng = np.random.default_rng(0)
    logits = rng.normal(size=10)*2
    reply = JudgeReply('7', tokens=['7'], top_logprobs=[{str(d): float(l) for d, l in enumerate(logits)}])
    got, why = parse_meta_score(reply, 'expectation')
    assert abs(got - ref.meta_expectation(logits)) < 1e-9 and not why


def test_hpsv2_loader(monkeypatch):
    "Without hpsv2 the error names the extra; with it, the model is built once and scores are image-text dot products."
    import sys, types
    from worldlab.rewards import hpsv2_scorer
    if 'hpsv2' not in sys.modules:
        with pytest.raises(ImportError, match=r"pip install 'worldlab\[hpsv2\]'"): hpsv2_scorer('cpu')
    built = []
    class Model(torch.nn.Module):
        def forward(self, image, text):
            f = torch.nn.functional.normalize(image.flatten(1)[:, :4], dim=-1)
            return dict(image_features=f, text_features=torch.nn.functional.normalize(text.float()[:, :4], dim=-1))
        def load_state_dict(self, sd, strict=True): built.append(sd); return None
    def create(name, pretrained, **kw): built.append((name, pretrained)); return Model(), None, lambda im: torch.tensor(np.asarray(im), dtype=torch.float32).permute(2, 0, 1)
    oc = types.ModuleType('hpsv2.src.open_clip'); oc.create_model_and_transforms = create
    oc.get_tokenizer = lambda name: (lambda texts: torch.tensor([[1, 2, 3, 4]]*len(texts)))
    for name, mod in (('hpsv2', types.ModuleType('hpsv2')), ('hpsv2.src', types.ModuleType('hpsv2.src')), ('hpsv2.src.open_clip', oc)):
        monkeypatch.setitem(sys.modules, name, mod)
    ck = Path(__file__).parent/'_hps_ck.pt'
    torch.save(dict(state_dict={'w': torch.ones(1)}), ck)
    try: fn = hpsv2_scorer('cpu', checkpoint=str(ck))
    finally: ck.unlink()
    from PIL import Image
    img = Image.fromarray(np.full((2, 2, 3), 7, np.uint8))
    s = fn([img, img], ['a', 'b'])
    assert built[0] == ('ViT-H-14', None) and built[1] == {'w': torch.ones(1)} and fn.label == 'HPSv2.1'
    np.testing.assert_allclose(s, [float(np.dot([.5]*4, np.array([1, 2, 3, 4])/math.sqrt(30)))]*2, rtol=1e-6)


def test_training_log_keeps_columns_across_phases(tmp_path):
    "A phase that logs fewer reward columns than the first must not shift its values into other columns."
    from worldlab.config import resolve
    from worldlab.train import train
    params = resolve('tiny', dict(height=32, width=32, num_frames=5, num_steps=2, group_size=2, prompts_per_batch=1,
                                 steps=2, main_steps=1, dynamic_steps=1, reward_weights={'red': 1.0, 'green': 1.0},
                                 dynamic_reward_weights={'green': 1.0}))
    hist = train(params, tmp_path/'run', progress=False)
    assert list(hist.phase) == ['main', 'dynamic']
    assert hist['reward/green'].notna().all() and np.isnan(hist['reward/red'].iloc[1])
    np.testing.assert_allclose(hist['reward_mean'].iloc[1], hist['reward/green'].iloc[1])   # the dynamic reward is green alone


# --- DiffusionNFT and WorldReward's RL (worldlab.nft, verdicts.pairwise_rewards) ------------------------------------------
def test_nft_loss_matches_the_releases():
    "DiffusionNFT's loss (with its KL) and WorldReward's (beta 1, no scale, no KL) on random inputs, many betas."
    from worldlab.nft import nft_loss, optimality_probability
    g = torch.Generator().manual_seed(11)
    for beta, c, kl in ((1.0, 5.0, 1e-4), (0.1, 5.0, 1e-4), (1.0, 2.0, 0.0), (0.5, 3.0, 0.01)):
        v, v_old, v_ref, x0, eps = (torch.randn(4, 3, 2, 5, 6, generator=g, dtype=torch.float64) for _ in range(5))
        t = torch.rand(4, generator=g, dtype=torch.float64)*0.98 + 0.01
        adv = torch.randn(4, generator=g, dtype=torch.float64)*4
        xt = (1 - t.view(-1, 1, 1, 1, 1))*x0 + t.view(-1, 1, 1, 1, 1)*eps
        mine, _ = nft_loss(v, v_old, xt, x0, t, optimality_probability(adv, c), beta, c, v_ref, kl)
        want = ref.nft_loss(v, v_old, v_ref, xt, x0, t, adv, beta, c, kl)
        assert abs(float(mine.mean()) - want) < 1e-9*max(1, abs(want)), (beta, c, float(mine.mean()), want)


def test_nft_old_decay_matches_the_releases():
    from worldlab.config import TrainConfig
    from worldlab.nft import old_decay
    for s in (1, 2, 50, 499, 500, 501, 2000):
        assert abs(old_decay(TrainConfig(), s) - ref.nft_return_decay(s, 1)) < 1e-12, s
        wr = TrainConfig(nft_decay_start=0.4, nft_decay_max=0.9, nft_decay_rate=0.01)
        assert abs(old_decay(wr, s) - ref.wr_policy_decay(s)) < 1e-12, s


def test_fused_advantages_match_the_release_dispatcher():
    "Two rewards, weights 2:1, three prompts of 4 videos, the batch's std (std_type global) and the group's."
    from worldlab.nft import fused_advantages
    rng = np.random.default_rng(5)
    for std in ('global', 'group'):
        outs = {'vlm_action': rng.random(12), 'vlm_vq': rng.random(12)}
        groups = [k//4 for k in range(12)]
        A = fused_advantages({k: torch.tensor(v) for k, v in outs.items()}, {'vlm_action': 2, 'vlm_vq': 1}, groups, std)
        want = ref.wr_compute_advantages(outs, {'vlm_action': 2, 'vlm_vq': 1}, groups, std)
        np.testing.assert_allclose(A['advantages'].numpy(), want, atol=1e-5)


def test_win_rates_match_the_release_aggregation():
    "Soft and hard verdicts from a comparator with a position bias, one random side per pair: the release's sums."
    from worldlab.verdicts import pairwise_rewards, pair_schedule, _pair_seed
    q = torch.tensor([0.3, 1.2, -0.4, 0.8, 0.0])                      # each video's hidden quality
    for soft in (True, False):
        def compare(videos, prompts, metas, pairs):
            p = [float(torch.sigmoid(q[i] - q[j] + 0.4)) for i, j in pairs]      # 0.4: prefers the left video
            return [{'action': x if soft else float(x > 0.5)} for x in p]
        rw = pairwise_rewards(compare, ('action',), 'worldreward', 'swap', seed=9)['worldreward_action']
        mine, _ = rw(torch.zeros(5, 2, 3, 4, 4), ['p']*5, [dict(group='g7')]*5)
        rows = []
        for left, right in pair_schedule(5, _pair_seed(9, 'g7')):     # the sides worldlab showed
            i, j = min(left, right), max(left, right)
            pa = float(torch.sigmoid(q[left] - q[right] + 0.4))
            rows.append((i, j, *ref.wr_pair_scores(pa if soft else float(pa > 0.5), left, i, j)))
        np.testing.assert_allclose(mine.numpy(), ref.wr_win_rates(5, rows), atol=1e-12)


def test_nft_release_variants_train():
    "WorldReward's choices on the tiny twin: fused advantages of two rewards, 2 of 4 videos trained, SDE rollouts."
    from worldlab.config import TrainConfig
    from worldlab.nft import NFTTrainer
    from worldlab.policy import WanPolicy
    from worldlab.reward_contract import channel_mean_reward
    cfg = TrainConfig(algorithm='nft', height=32, width=32, num_frames=5, num_steps=4, group_size=4, prompts_per_batch=2,
                      lora_rank=4, lora_alpha=8, reward_weights={'red': 2.0, 'green': 1.0}, nft_advantages='fused',
                      nft_best_of=2, nft_rollout='sde', beta=0.0, nft_decay_start=0.4, nft_decay_max=0.9,
                      nft_decay_rate=0.01, seed=3)
    tr = NFTTrainer(WanPolicy.tiny(seed=0), cfg, {'red': channel_mean_reward(0), 'green': channel_mean_reward(1)},
                    ['camera pan left a red house', 'camera push in a lake at dawn'])
    m = tr.train_step()
    assert (m['trained_share'], m['window_hi'], round(m['old_decay'], 6)) == (0.5, 4, 0.41), m
    assert 'kl' not in m and m['grad_norm'] > 0, m


# --- MVCS: VideoGPA's released metric ------------------------------------------------------------------------------------
def _mvcs_scene(seed, noise):
    "Depth maps of a tilted plane seen by an orbiting, pushing camera, with multiplicative noise; w2c; K."
    from worldlab.camera import chain_trajectory
    g = torch.Generator().manual_seed(seed)
    t = chain_trajectory(['orbit_left', 'push_in'], num_frames=6, H=20, W=28)
    K = t.K.double()[0] if t.K.ndim == 3 else t.K.double()
    n = torch.tensor([0.1, -0.2, 1.0], dtype=torch.float64); n /= n.norm()
    v, u = torch.meshgrid(torch.arange(20.), torch.arange(28.), indexing='ij')
    rays = torch.linalg.solve(K, torch.stack([u, v, torch.ones_like(u)]).reshape(3, -1).double())
    d = torch.stack([((1.6 - n @ c[:3, 3])/(n @ (c[:3, :3] @ rays))).reshape(20, 28) for c in t.c2w])
    d = d*(1 + noise*torch.randn(d.shape, generator=g, dtype=torch.float64))
    return d, K.expand(6, 3, 3), torch.linalg.inv(t.c2w)


@pytest.mark.parametrize('seed,noise', [(0, 0.0), (1, 0.02), (2, 0.1)])
def test_mvcs_matches_videogpa(seed, noise):
    "edge='videogpa' is VideoGPA's number (float32 there: 1e-5); edge='inside' differs only by the border half pixel."
    from worldlab.metrics import mvcs
    d, K, E = _mvcs_scene(seed, noise)
    theirs, ours = ref.videogpa_mvcs(d, K, E[:, :3, :]), mvcs(d, K, E, edge='videogpa')
    print(f"seed {seed} noise {noise}: VideoGPA {theirs:.7f}, worldlab(videogpa) {ours:.7f}, "
          f"worldlab(inside) {mvcs(d, K, E):.7f}")
    assert abs(theirs - ours) < 1e-5, (theirs, ours)
    if noise == 0: assert mvcs(d, K, E) > 1 - 1e-6 and mvcs(d, K, E) >= ours, (mvcs(d, K, E), ours)


def test_mvcs_without_valid_pixels_is_nan_where_videogpa_says_0():
    from worldlab.metrics import mvcs
    d, K, E = _mvcs_scene(0, 0.0)
    behind = -d                                                   # every point behind the next camera
    assert ref.videogpa_mvcs(behind, K, E) == 0.0 and math.isnan(mvcs(behind, K, E))
