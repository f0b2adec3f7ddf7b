"""DiffusionNFT through the trainer's code paths: two processes (DDP rule, FSDP2) take the same NFT update as one,
micro-batches leave its gradient unchanged, a resumed run continues exactly, and `worldlab-train -p algorithm nft`
runs from the CLI (the release's variants: tests/test_fidelity.py)."""
import os, subprocess, sys
from dataclasses import replace
from pathlib import Path
import pandas as pd, torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}

from worldlab.config import TrainConfig
from worldlab.nft import NFTTrainer
from worldlab.policy import WanPolicy
from worldlab.reward_contract import channel_mean_reward
from test_train import _dist                  # tests/dist_step.py on 1 or 2 processes

CFG = TrainConfig(algorithm='nft', height=32, width=32, num_frames=5, num_steps=4, group_size=4, prompts_per_batch=2,
                  lora_rank=4, lora_alpha=8, learning_rate=1e-3, beta=1e-4, reward_weights={'red': 1.0}, seed=3)
PROMPTS = ['camera pan left a red house', 'camera push in a lake at dawn']


def trainer(cfg=CFG, run_dir=None):
    rewards = {'red': channel_mean_reward(0), 'green': channel_mean_reward(1)}
    return NFTTrainer(WanPolicy.tiny(seed=0), cfg, rewards, PROMPTS, run_dir=run_dir)


def test_two_processes_take_the_same_nft_updates_as_one(tmp_path):
    "Two NFT steps (AdamW, EMA, the old policy) on 2 gloo processes, DDP rule and FSDP2, against 1 process."
    one, ddp, fsdp = (_dist(tmp_path/f'{m}.pt', n, m) for m, n in (('ddp:nft', 1), ('ddp:nft', 2), ('fsdp:nft', 2)))
    assert (one['world'], ddp['world'], fsdp['world'], fsdp['sharded'], one['algorithm']) == (1, 2, 2, True, 'nft')
    assert max(v.abs().max() for v in one['trainable'].values()) > 1e-4      # the update is not trivially zero
    for other in (ddp, fsdp):
        for k in one['trainable']:
            torch.testing.assert_close(other['trainable'][k], one['trainable'][k], atol=1e-6, rtol=1e-5)
        for a, b in zip(one['metrics'], other['metrics']):
            for col in ('reward_mean', 'policy_loss', 'pos_loss', 'grad_norm', 'old_decay'):
                assert abs(a[col] - b[col]) < 1e-5, (col, a[col], b[col])
        for x, y in zip(one['old'] + one['ema'], other['old'] + other['ema']): torch.testing.assert_close(y, x, atol=1e-6, rtol=1e-5)


def test_fused_advantages_on_two_processes_equal_one(tmp_path):
    "WorldReward's fused advantages use the whole batch's statistics: gathered from every process, the same update."
    one, two = (_dist(tmp_path/f'f{n}.pt', n, 'ddp:nft-fused') for n in (1, 2))
    # AdamW moves each weight by about lr = 1e-3 a step, whatever the gradient's size, so a wrong slice of the batch's
    # advantages shows at 1e-3; float32 sums in another order moved the weights by up to 3.3e-6 (measured)
    for k in one['trainable']:
        torch.testing.assert_close(two['trainable'][k], one['trainable'][k], atol=2e-5, rtol=1e-5)
    for a, b in zip(one['metrics'], two['metrics']):
        for col in ('reward_mean', 'adv_abs_mean', 'policy_loss', 'zero_std_ratio'): assert abs(a[col] - b[col]) < 1e-5, (col, a[col], b[col])


def _grads(cfg):
    tr = trainer(cfg)
    _, prompts = tr.batch_prompts(); mine = [0, 1]
    rolls, embs = tr.rollout(prompts, mine, tr.window())
    rewards, info, _ = tr.score(prompts, mine, rolls)
    A = tr.advantages(rewards, mine, info)
    tr.apply_gradients = lambda: 0.0                          # keep the gradients, take no step
    stats, _ = tr.update(rolls, embs, A, tr.window())
    return [p.grad.clone() for p in tr.params], stats[0]


def test_micro_batches_leave_the_nft_gradient_unchanged():
    "Micro-batches of 1 and 3 videos give the whole group's gradient (float32 sums in another order: 1e-4 relative)."
    g0, s0 = _grads(CFG)
    for mb in (1, 3):
        g, s = _grads(replace(CFG, micro_batch=mb))
        rel = max(float((a - b).norm()/b.norm().clamp_min(1e-12)) for a, b in zip(g, g0))
        assert rel < 1e-4, (mb, rel)
        assert abs(s['policy_loss'] - s0['policy_loss']) < 1e-5, (mb, s['policy_loss'], s0['policy_loss'])


def test_a_resumed_nft_run_continues_exactly(tmp_path):
    "Three steps straight, against two steps, a new trainer from the checkpoint, and the third (old policy restored)."
    straight = pd.DataFrame(trainer(run_dir=tmp_path/'a').fit(3, progress=False))
    trainer(run_dir=tmp_path/'b').fit(2, progress=False)
    resumed = pd.DataFrame(trainer(run_dir=tmp_path/'b').fit(3, progress=False))
    assert list(resumed.step) == [2]
    for col in ('reward_mean', 'policy_loss', 'old_deviate', 'grad_norm'):
        assert abs(straight[col].iloc[2] - resumed[col].iloc[0]) < 1e-6, (col, straight[col].tolist(), resumed[col].tolist())


def test_worldlab_train_runs_nft_from_the_cli(tmp_path):
    cmd = [str(BIN/'worldlab-train'), '--preset', 'tiny-nft', '--run-dir', str(tmp_path), '--quiet', '-p', 'steps', '1',
           '-p', 'height', '32', '-p', 'width', '32', '-p', 'num_frames', '5']
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = pd.read_csv(tmp_path/'metrics.csv')
    assert len(m) == 1 and {'pos_loss', 'neg_loss', 'r_mean', 'cpu_seconds'} <= set(m.columns), list(m.columns)
    assert (tmp_path/'adapter_ema').is_dir()
    bad = subprocess.run(cmd + ['-p', 'guidance_scale', '3'], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert bad.returncode == 2 and 'without classifier-free guidance' in bad.stderr, bad.stderr[-2000:]


def test_warm_start_starts_the_old_policy_from_the_adapter(tmp_path):
    "An NFT run started from an adapter samples from it: the old policy holds the adapter's weights, not the initial ones."
    from worldlab.adapters import export_checkpoint
    from worldlab.train import warm_start
    trainer(run_dir=tmp_path).fit(1, progress=False)
    export_checkpoint(tmp_path/'checkpoint.pt', tmp_path)
    fresh, warm = trainer(), warm_start(trainer(), tmp_path)
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(warm.params, fresh.params))
    assert moved > 0, moved                                              # the adapter differs from the initial weights
    for o, p in zip(warm.old, warm.params): torch.testing.assert_close(o, p)
