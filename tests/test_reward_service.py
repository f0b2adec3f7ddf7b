"The reward service as a user starts it (`worldlab-rewards`), scored through the HTTP client against in-process scores."
import os, subprocess, sys
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_worldlab_rewards_serves_what_runs_in_process():
    from worldlab.camera import chain_trajectory
    from worldlab.core import to_float
    from worldlab.scenes import make_world, render_video
    from worldlab.rewards import make_rewards
    from worldlab.reward_service import remote_reward
    traj = chain_trajectory(['push_in'], 5, 32, 32)
    video = to_float(render_video(make_world('micro_still_life', seed=0), traj))[None]
    p = subprocess.Popen([str(BIN/'worldlab-rewards'), '--rewards', 's_recon,s_traj', '--lpips', 'random', '--port', '0'],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, 'OMP_NUM_THREADS': '1'})
    try:
        line = p.stdout.readline()
        assert 'serving' in line, (line, p.stderr.read() if p.poll() is not None else '')
        url = line.split(' at ')[-1].strip()
        there, info = remote_reward(url, 's_traj')(video, ['Camera push in.'], [{'traj': traj}])
        here, _ = make_rewards(lpips='random')['s_traj'](video, ['Camera push in.'], [{'traj': traj}])
        assert abs(float(there[0]) - float(here[0])) < 1e-6, (there, here)
        assert info['s_traj/alignment'][0].startswith('sim3')
    finally:
        p.terminate(); p.wait(timeout=30)
