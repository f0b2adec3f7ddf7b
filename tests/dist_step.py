"One GRPO step on the tiny Wan; writes the adapter after the update (used by test_train.py, in 1 or 2 processes)."
import sys, torch
from worldlab.policy import WanPolicy
from worldlab.grpo import Trainer, TrainConfig, channel_mean_reward

out = sys.argv[1]
cfg = TrainConfig(height=32, width=32, num_frames=5, num_steps=4, group_size=3, prompts_per_batch=2, lora_rank=4, lora_alpha=8,
                  learning_rate=1e-3, clip_range=0.2, beta=0.01, reward_weights={'red': 1.0}, seed=7)
tr = Trainer(WanPolicy.tiny(seed=0), cfg, {'red': channel_mean_reward(0)},
             ['camera pan left a red house', 'camera push in a lake at dawn'])
m = tr.train_step()
if tr.acc.is_main_process:
    torch.save(dict(lora=tr.policy.lora_state(), world=tr.acc.num_processes), out)
tr.acc.wait_for_everyone()
