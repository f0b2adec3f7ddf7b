"""Two GRPO (or NFT) steps on the tiny Wan, then a checkpoint; used by test_train.py and test_nft.py in 1 process, 2
processes (DDP rule) or 2 processes with the transformer sharded by FSDP2. Usage: dist_step.py OUT.pt [ddp|fsdp][:nft]
[ADAPTER]; with an ADAPTER (test_adapters.py) the trainer is warm-started from it and checkpointed without a step."""
import sys, torch
from worldlab.policy import WanPolicy
from worldlab.grpo import Trainer, TrainConfig, channel_mean_reward
from worldlab.nft import NFTTrainer

out, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else 'ddp')
mode, _, algorithm = mode.partition(':')          # nft-fused: NFT with WorldReward's fused advantages of two rewards
fused = algorithm == 'nft-fused'
algorithm = 'nft' if fused else (algorithm or 'grpo')
cfg = TrainConfig(algorithm=algorithm, nft_advantages='fused' if fused else 'group', height=32, width=32, num_frames=5, num_steps=4, group_size=3, prompts_per_batch=2, lora_rank=4, lora_alpha=8,
                  learning_rate=1e-3, clip_range=0.2, beta=0.01, reward_weights={'red': 2.0, 'green': 1.0} if fused else {'red': 1.0}, ema=0.9, seed=7, fsdp=mode == 'fsdp')
tr = (NFTTrainer if algorithm == 'nft' else Trainer)(WanPolicy.tiny(seed=0), cfg, {'red': channel_mean_reward(0), 'green': channel_mean_reward(1)},
             ['camera pan left a red house', 'camera push in a lake at dawn'])
if len(sys.argv) > 3:
    from worldlab.train import warm_start
    warm_start(tr, sys.argv[3]); metrics = []
else: metrics = [tr.train_step() for _ in range(2)]
tr.save(out)                                     # every process takes part (FSDP gathers the shards)
if tr.acc.is_main_process:
    st = torch.load(out, weights_only=False)
    st.update(world=tr.acc.num_processes, sharded=tr.sharded, metrics=metrics)
    torch.save(st, out)
tr.acc.wait_for_everyone()
