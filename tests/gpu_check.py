"""The GPU checks for a lent CUDA machine, without nbdev or a model hub there (`bash tests/gpu_check.sh` runs this):
the `mini` preset trains on CUDA with i.i.d. and camera SDE draws, a CUDA rollout matches the CPU's from the same
draws, `worldlab run generate`'s code makes the same mini-Wan videos (shipped adapter on) on CUDA as on the CPU,
the camera noise at Wan2.1's full latent size is timed on both devices, and the `wan2.1-1.3b` preset's GRPO step runs
on the real-size 1.3B (random weights) at two sizes, its peak memory compared with `worldlab.memory`'s plan; the
`mini-steer-nft` preset's DiffusionNFT steps run on CUDA.
`python tests/gpu_check.py --device cpu --preset mini-smoke` runs the same code on a CPU in about a minute."""
import argparse, json, math, os, sys, tempfile, time
from pathlib import Path

import torch


def train_steps(preset:str, device:str, steps:int, sde:str) -> dict:
    "GRPO steps of `preset` on `device`: every step logged with finite reward, loss, KL and gradient norm; timings."
    from worldlab.config import resolve
    from worldlab.train import train
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        h = train(resolve(preset, dict(device=device, steps=steps, sde_noise=sde)), d, progress=False)
        cols = ['reward_mean', 'policy_loss', 'kl', 'grad_norm']
        return dict(ok=bool(len(h) == steps and h[cols].notna().all().all()), seconds=round(time.time() - t0, 1),
                    steps=len(h), reward_mean=[round(float(x), 4) for x in h.reward_mean],
                    t_sample=round(float(h.t_sample.mean()), 2), t_reward=round(float(h.t_reward.mean()), 2),
                    t_update=round(float(h.t_update.mean()), 2))


def nft_steps(device:str, steps:int, smoke:bool=False) -> dict:
    "DiffusionNFT steps of `mini-steer-nft` on `device`: finite reward, NFT loss parts and gradient norm every step."
    from worldlab.config import resolve
    from worldlab.train import train
    small = dict(num_steps=4, group_size=2, prompts_per_batch=1) if smoke else {}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        h = train(resolve('mini-steer-nft', dict(device=device, steps=steps) | small), d, progress=False)
        cols = ['reward_mean', 'policy_loss', 'pos_loss', 'neg_loss', 'grad_norm']
        return dict(ok=bool(len(h) == steps and h[cols].notna().all().all()), seconds=round(time.time() - t0, 1),
                    steps=len(h), reward_mean=[round(float(x), 4) for x in h.reward_mean],
                    t_sample=round(float(h.t_sample.mean()), 2), t_reward=round(float(h.t_reward.mean()), 2),
                    t_update=round(float(h.t_update.mean()), 2))


def rollout_final(preset:str, device:str, sde:str) -> torch.Tensor:
    "The first group's final latents of step 0 on `device` (the draws are made on the CPU either way)."
    from worldlab.config import resolve
    from worldlab.train import make_trainer
    with tempfile.TemporaryDirectory() as d:
        tr = make_trainer(resolve(preset, dict(device=device, steps=1, sde_noise=sde)), d)
        _, prompts = tr.batch_prompts()
        rolls, _ = tr.rollout(prompts, [0], tr.window())
        return rolls[0].final.float().cpu()


def warp_timing(device:str, repeats:int=3) -> dict:
    "Seconds for one camera noise at Wan2.1's 81 frames of 480x832 (latents 16x21x60x104), and its statistics."
    from worldlab.camera import trajectory_from_prompt
    from worldlab.warp import camera_noise
    traj = trajectory_from_prompt('Camera orbit left. A castle on a hill.', 81, 480, 832)
    g = torch.Generator(device).manual_seed(0)
    z = camera_noise(traj, 16, 4, 8, generator=g, device=device)                     # warm-up (kernels, caches)
    times = []
    for _ in range(repeats):
        if device == 'cuda': torch.cuda.synchronize()
        t0 = time.perf_counter()
        z = camera_noise(traj, 16, 4, 8, generator=g, device=device)
        if device == 'cuda': torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return dict(shape=list(z.shape), seconds=sorted(times)[len(times)//2], mean=float(z.mean()), std=float(z.std()))


def generate_videos(preset:str, device:str, out:str) -> dict:
    "`worldlab run generate`'s code on `device`: two held-out captions with the shipped RL adapter; frames [N,F,H,W,3]."
    from worldlab.config import resolve
    from worldlab.core import read_video
    from worldlab.generate import GenerateConfig, generate
    cfg, rc = resolve(preset, dict(device=device))
    t0 = time.time()
    res = generate(cfg, rc, GenerateConfig(prompts='corpus:test', limit=2, seeds='1', adapters='data/mini_wan_rl'),
                   Path(out)/f'generate_{device}', progress=False)
    frames = [read_video(Path(out)/f'generate_{device}'/'videos'/f'{s}.mp4')[0] for s in sorted(res.made + res.kept)]
    return dict(seconds=round(time.time() - t0, 1), videos=len(frames), frames=frames)


def realsize_memory(device:str, sizes=('17x240x416', '33x240x416'), layers:int=0) -> dict:
    ("The `wan2.1-1.3b` preset's GRPO step on the real-size random-weight 1.3B in bf16 (gradient checkpointing, "
     "micro-batches of one) at two video sizes: the memory plan against `torch.cuda.max_memory_allocated`.")
    import dataclasses
    from worldlab.config import resolve
    from worldlab.memory import memory_plan
    from worldlab.train import make_trainer
    rows = []
    for v in sizes:
        F, H, W = map(int, v.split('x'))
        tc, rc = resolve('wan2.1-1.3b', dict(model=f"random:wan2.1-1.3b{f':{layers}' if layers else ''}", device=device,
                                             num_frames=F, height=H, width=W, num_steps=4, group_size=2,
                                             prompts_per_batch=1, steps=1, reward_weights={'red': 1.0},
                                             gradient_checkpointing=True, micro_batch=1))
        if device == 'cuda': torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        with tempfile.TemporaryDirectory() as d:
            tr = make_trainer((tc, rc), d)
            m = tr.train_step()
        peak = torch.cuda.max_memory_allocated()/2**30 if device == 'cuda' else float('nan')
        plan = memory_plan(tc, rc, 1, 80) if not layers else None
        # the plan without its assumed overhead and UMT5-XXL's weights (the random model's text encoder is a stand-in)
        left_out = plan.gib[plan.part.str.contains('overhead|text encoder')].sum() if plan is not None else 0.0
        need = plan.attrs['need_gib'] - left_out if plan is not None else float('nan')
        rows.append(dict(video=v, seconds=round(time.time() - t0, 1), peak_gib=round(peak, 2), plan_gib=round(need, 2),
                         error=round((need - peak)/peak, 3) if peak == peak and need == need else None,
                         reward=m['reward_mean'], finite=all(map(math.isfinite, (m['policy_loss'], m['grad_norm'])))))
        del tr
    return dict(ok=all(r['finite'] for r in rows), rows=rows)


def vbench_parity(device:str) -> dict:
    "VBench's dimensions (tiny random backbones, plumbing) of one corpus clip on `device` against the CPU's."
    import copy
    from worldlab.corpus import plan_corpus, render_clip
    from worldlab.vbench import tiny_vbench, vbench_scores
    frames = render_clip(plan_corpus(2, 0, seed=1)[0])[0]
    cpu = tiny_vbench()
    here = copy.deepcopy(cpu)
    for k, m in here.models.items():
        here.models[k] = tuple(x.to(device) for x in m) if isinstance(m, tuple) else m.to(device) if hasattr(m, 'to') else m
    a, b = vbench_scores(frames, here), vbench_scores(frames, cpu)
    diff = max(abs(a[k] - b[k]) for k in a)
    return dict(ok=diff < 1e-3, max_abs=diff, bound=1e-3, **{k: round(v, 5) for k, v in a.items()})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--device', default='cuda')
    ap.add_argument('--preset', default='mini')
    ap.add_argument('--steps', type=int, default=2)
    ap.add_argument('--out', default=os.environ.get('OUT', '.'))
    a = ap.parse_args(argv)
    if a.device == 'cuda' and not torch.cuda.is_available(): sys.exit("gpu_check: torch sees no CUDA device")
    res, failed = dict(device=a.device, torch=torch.__version__,
                       gpu=torch.cuda.get_device_name() if a.device == 'cuda' else None), []
    def check(name, fn):
        try: res[name] = fn()
        except Exception as e:                                    # one failing check does not hide the others
            import traceback
            res[name] = dict(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
        if not res[name].get('ok', True): failed.append(name)
        print(name, json.dumps({k: v for k, v in res[name].items() if k != 'traceback'}), flush=True)
    for sde in ('iid', 'camera'):
        check(f'train_{sde}', lambda: train_steps(a.preset, a.device, a.steps, sde))
    def parity():
        here, cpu = rollout_final(a.preset, a.device, 'camera'), rollout_final(a.preset, 'cpu', 'camera')
        rel = float((here - cpu).norm()/cpu.norm())
        # float32 on both, but CUDA's kernels (TF32 convolutions included) round differently over the steps
        return dict(ok=rel < 2e-2, relative_l2=rel, max_abs=float((here - cpu).abs().max()), bound=2e-2)
    check('train_nft', lambda: nft_steps(a.device, a.steps, smoke=a.preset.endswith('smoke')))
    check('rollout_parity', parity)
    def generate_parity():
        here = generate_videos(a.preset, a.device, a.out)
        cpu = generate_videos(a.preset, 'cpu', a.out) if a.device != 'cpu' else here
        diff = max(float(abs(x.astype(float) - y.astype(float)).mean())/255
                   for x, y in zip(here['frames'], cpu['frames']))
        # the same draws on both devices; the mp4s differ only by kernels' rounding through the steps and the decoder
        return dict(ok=here['videos'] == cpu['videos'] == 2 and diff < 0.02, mean_abs=diff, bound=0.02,
                    seconds=here['seconds'], seconds_cpu=cpu['seconds'])
    check('generate_parity', generate_parity)
    check('vbench_parity', lambda: vbench_parity(a.device))
    check('warp_timing', lambda: warp_timing(a.device) | dict(ok=True))
    if a.device == 'cuda': check('warp_timing_cpu', lambda: warp_timing('cpu', 1) | dict(ok=True))
    # the real-size step and the memory plan's error (on a CPU, one real-width block at a small size: the code path)
    check('realsize_memory', lambda: realsize_memory(a.device) if a.device == 'cuda' else
          realsize_memory(a.device, ('5x64x64',), layers=1))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out)/'gpu_check.json').write_text(json.dumps(res, indent=1))
    print('FAILED: ' + ', '.join(failed) if failed else 'all GPU checks passed')
    return 1 if failed else 0


if __name__ == '__main__': sys.exit(main())
