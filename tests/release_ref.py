"""Independent transcriptions of the released code's formulas, for tests/test_fidelity.py.

Written from the released sources (microsoft/World-R1 at cf54603, yifan123/flow_grpo, CodeGoat24/WorldReward),
not from worldlab: numpy where the release uses numpy, float32 where it does. Each function names the file and
lines it transcribes. evo's Umeyama (used by the release through `evo.core.trajectory.PosePath3D.align`) is
transcribed from evo.core.geometry.umeyama_alignment, with its rank check.
"""
import math
import numpy as np

# --- flow_grpo/diffusers_patch/wan_pipeline_with_logprob.py:190-238 (Wan, UniPC: deterministic branch) ---------------
def sde_logprob(v, x, x_next, sigma, sigma_next, sigma_max, sigma_min):
    "log-prob [B], Euler mean, transition std of `x_next` (the UniPC sample) as the release scores it."
    v, x, x_next = (np.asarray(a, np.float64) for a in (v, x, x_next))
    dt = sigma_next - sigma
    std_dev_t = sigma_min + (sigma_max - sigma_min)*sigma                        # :200
    mean = x + dt*v                                                              # :203 (scheduler_is_deterministic)
    s = std_dev_t*math.sqrt(-dt)
    lp = -((x_next - mean)**2)/(2*(s**2 + 1e-12)) - math.log(s + 1e-12) - math.log(math.sqrt(2*math.pi))   # :227-231
    return lp.reshape(len(lp), -1).mean(1), mean, s

# --- flow_grpo/stat_tracking.py:11-31 and scripts/train_world_r1.py:1442-1471 ------------------------------------------
def advantages(prompts, rewards, per_prompt=True, global_std=False):
    "Advantages of the released trainer (population std everywhere: numpy's default ddof=0)."
    prompts, r = np.array(prompts), np.array(rewards, dtype=np.float64)
    if not per_prompt: return (r - r.mean())/(r.std() + 1e-4)                   # train_world_r1.py:1469-1471
    adv = np.empty_like(r)*0.0
    for p in np.unique(prompts):
        pr = r[prompts == p]
        std = (np.std(r) if global_std else np.std(pr)) + 1e-4                   # stat_tracking.py:26-29
        adv[prompts == p] = (pr - np.mean(pr))/std
    return adv

# --- scripts/train_world_r1.py:1601-1624 and :91-96 (Wan KL) -----------------------------------------------------------
def grpo_loss(logp, logp_old, adv, clip_range, adv_clip_max, mean, mean_ref, std_dev_t, sqrt_dt, beta):
    "The released loss for one timestep of a micro-batch: every sample counts, zero advantage or not."
    a = np.clip(adv, -adv_clip_max, adv_clip_max)
    ratio = np.exp(logp - logp_old)
    policy = np.mean(np.maximum(-a*ratio, -a*np.clip(ratio, 1 - clip_range, 1 + clip_range)))
    if beta <= 0: return policy
    noise_std = max(std_dev_t*sqrt_dt, 1e-8)
    kl = ((mean - mean_ref)**2).reshape(len(mean), -1).mean(1)/(2*noise_std**2)
    return policy + beta*kl.mean()

# --- flow_grpo/diffusers_patch/camera_trajectory_utils.py:83-122, 124-229, 232-277, 413-493, 1390-1399 ----------------
def _rot_y(a):
    r = np.radians(a); c, s = np.cos(r), np.sin(r)
    return np.array([[c, 0, s, 0], [0, 1, 0, 0], [-s, 0, c, 0], [0, 0, 0, 1]])

def _profile(name):
    p = dict(move_total=0.0, zoom_total=0.0, yaw_total_deg=0.0, orbit_radius=520.0, orbit_arc_deg=0.0)
    if name in ('orbit_left', 'orbit_right'): p.update(orbit_arc_deg=24.0, orbit_radius=600.0)
    elif name in ('pan_left', 'pan_right'): p['yaw_total_deg'] = 14.0 if name == 'pan_left' else -14.0
    elif name in ('push_in', 'pull_out'): p['zoom_total'] = 600.0
    elif name in ('move_left', 'move_right'): p['move_total'] = 220.0
    return p

def _segment(name, n, start=(0.0, 0.0, 0.0)):
    "TrajectoryGenerator.generate: n frames of one primitive (pitch and roll 0, as every profile has them)."
    p, steps = _profile(name), max(n - 1, 1)
    sm, sz, sr = abs(p['move_total'])/steps, abs(p['zoom_total'])/steps, abs(p['yaw_total_deg'])/steps
    R_, arc, out = p['orbit_radius'], p['orbit_arc_deg'], []
    for i in range(n):
        prog = i/steps
        m = np.eye(4); m[:3, 3] = start
        def tr(o):
            T = np.eye(4); T[:3, 3] = o; return T
        if name == 'push_in': m = m @ tr([0, 0, sz*i])
        elif name == 'pull_out': m = m @ tr([0, 0, -sz*i])
        elif name == 'move_left': m = m @ tr([-sm*i, 0, 0])
        elif name == 'move_right': m = m @ tr([sm*i, 0, 0])
        elif name in ('pan_left', 'pan_right'):
            pos = m[:3, 3].copy(); m[:3, 3] = 0
            m = m @ _rot_y((-1 if name == 'pan_left' else 1)*sr*i); m[:3, 3] = pos
        elif name.startswith('orbit'):
            c = np.array(start) + np.array([0, 0, -R_])
            ang = arc*prog if 'left' in name else -arc*prog
            m[:3, 3] = [c[0] + R_*np.sin(np.radians(ang)), start[1], c[2] + R_*np.cos(np.radians(ang))]
            m[:3, :3] = _rot_y(-ang)[:3, :3]
        if name in ('push_in', 'pull_out', 'move_left', 'move_right'):
            m[:3, :3] = _rot_y((-1.0 if name in ('pull_out', 'move_left') else 1.0)*sr*i)[:3, :3]
        out.append(m)
    return out

def _fmt(m):
    "format_matrix then parse_camera_matrix: the %.6g round trip every pose makes (camera_trajectory_utils.py:66-76)."
    return np.array([[float(f'{m[r, c]:.6g}') for c in range(4)] for r in range(4)])

def chain(names, F=81, start=(3390, 1380, 240)):
    "get_camera_trajectory_for_prompts: ceil(F/n) frames a segment, boundary pose repeated; c2w [n*s,4,4] float64."
    s = max(2, int(math.ceil(F/len(names))))
    cur, poses = np.eye(4), []
    cur[:3, 3] = start
    for name in names:
        seg = [_fmt(m) for m in _segment(name, s)]
        poses += [_fmt(cur @ m) for m in seg]
        cur = cur @ seg[-1]
    return np.stack(poses)

def select(total, F):
    "generate_camera_warped_latents' uniform resampling of the chain to F frames (:1390-1399)."
    if F >= total: return list(range(total))
    return [int(round(i*(total - 1)/(F - 1))) if F > 1 else 0 for i in range(F)]

def select_padded(total, F):
    "reward_3d_backend.py:274-284 (_select_frame_indices): the same, padding with the last pose when F > total."
    if total <= 0 or F <= 0: return []
    if F >= total: return list(range(total)) + [total - 1]*(F - total)
    if F == 1: return [0]
    return [int(round(i*(total - 1)/(F - 1))) for i in range(F)]

# --- evo.core.geometry.umeyama_alignment (used by pose_align.py:84-89) -------------------------------------------------
class Degenerate(Exception): pass

def umeyama(x, y):
    "x, y [3,n]: r, t, c with y ~ c r x + t; raises like evo when the covariance rank is below 2."
    m, n = x.shape
    mx, my = x.mean(axis=1), y.mean(axis=1)                  # in the input's dtype (float32 here)
    sigma_x = 1.0/n*(np.linalg.norm(x - mx[:, None])**2)
    outer_sum = np.zeros((m, m))                             # float64: the rank test below uses float64's eps
    for i in range(n): outer_sum += np.outer(y[:, i] - my, x[:, i] - mx)
    cov = np.multiply(1.0/n, outer_sum)
    u, d, v = np.linalg.svd(cov)
    if np.count_nonzero(d > np.finfo(d.dtype).eps) < m - 1: raise Degenerate("Degenerate covariance rank")
    S = np.eye(m)
    if np.linalg.det(u)*np.linalg.det(v) < 0: S[m - 1, m - 1] = -1
    r = u @ S @ v
    c = 1/sigma_x*np.trace(np.diag(d) @ S)
    return r, my - c*r @ mx, c

def _apply(poses, r, t, s):
    out = poses.copy(); out[:, :3, :3] = r @ poses[:, :3, :3]; out[:, :3, 3] = (r @ (s*poses[:, :3, 3].T)).T + t
    return out

def align_ransac(pose_ref, pose_est, max_iters=10, seed=None):
    "pose_align.py:101-155: RANSAC over Umeyama subsets (the pre-alignment raising ends it)."
    N = len(pose_ref)
    rng, sub = np.random.default_rng(seed), max(3, (N + 1)//2)
    r0, t0, s0 = umeyama(pose_est[:, :3, 3].T, pose_ref[:, :3, 3].T)
    pe0 = _apply(pose_est, r0, t0, s0)
    thr = float(np.median([np.linalg.norm(pose_ref[:, :3, 3] - p, axis=1).min() for p in pe0[:, :3, 3]]))
    best, best_inl, best_score = (r0, t0, s0), None, (-1, np.inf)
    for _ in range(max_iters):
        smp = rng.choice(np.arange(N), size=sub, replace=False)
        try: r, t, s = umeyama(pose_est[smp, :3, 3].T, pose_ref[smp, :3, 3].T)
        except Degenerate: continue
        errs = np.linalg.norm(_apply(pose_est, r, t, s)[:, :3, 3] - pose_ref[:, :3, 3], axis=1)
        inl = errs <= thr; k = int(inl.sum()); me = float(errs[inl].mean()) if k else np.inf
        if k > best_score[0] or (k == best_score[0] and me < best_score[1]): best_score, best, best_inl = (k, me), (r, t, s), inl
    if best_inl is not None and best_inl.sum() >= 3: best = umeyama(pose_est[best_inl, :3, 3].T, pose_ref[best_inl, :3, 3].T)
    return best

# --- reward_server/reward_3d_backend.py:330-429 and :525-580 -----------------------------------------------------------
def _geodesic_deg(a, b):
    tr = np.clip((np.trace(a.T @ b) - 1.0)*0.5, -1.0, 1.0)
    return float(np.degrees(np.arccos(tr)))

def _total_rot(p): return sum(_geodesic_deg(p[i - 1, :3, :3], p[i, :3, :3]) for i in range(1, len(p)))
def _total_trans(c): return float(np.linalg.norm(np.diff(c, axis=0), axis=1).sum()) if len(c) > 1 else 0.0
def _rel(p): return np.stack([np.linalg.inv(p[0]) @ q for q in p])   # reward_3d_backend.py:330-332

def _cos01(a, b, eps=1e-6):
    na, nb = float(np.linalg.norm(a.ravel())), float(np.linalg.norm(b.ravel()))
    if na < eps and nb < eps: return 1.0
    if na < eps or nb < eps: return 0.0
    return 0.5*(np.clip(float(np.dot(a.ravel(), b.ravel())/(na*nb)), -1.0, 1.0) + 1.0)

def motion_profile(pred, target):
    "_compute_motion_profile_scores (reward_3d_backend.py:367-429)."
    pc, tc = pred[:, :3, 3], target[:, :3, 3]
    pt, tt, pr, trr = _total_trans(pc), _total_trans(tc), _total_rot(pred), _total_rot(target)
    if tt < 1e-4: ts = float(np.exp(-pt/3.0))
    else:
        err = float(np.linalg.norm(pc - tc, axis=1).mean())
        scale = max(tt/max(len(tc) - 1, 1), 1.0)
        ts = 0.4*_cos01(pc, tc) + 0.3*float(np.exp(-abs(np.log((pt + 1e-6)/(tt + 1e-6))))) + 0.3*float(np.exp(-err/(2.0*scale)))
    errs = [_geodesic_deg(t[:3, :3], p[:3, :3]) for p, t in zip(pred, target)]
    if trr < 1e-3: rs = float(np.exp(-pr/5.0))
    else: rs = 0.5*np.exp(-np.mean(errs)/6.0) + 0.3*np.exp(-errs[-1]/6.0) + 0.2*np.exp(-abs(np.log((pr + 1e-6)/(trr + 1e-6))))
    if tt < 1e-4 and trr < 1e-3: f = ts*rs
    elif tt < 1e-4: f = 0.2*ts + 0.8*rs
    elif trr < 1e-3: f = 0.8*ts + 0.2*rs
    else: f = 0.5*(ts + rs)
    return float(np.clip(f, 0.0, 1.0)), dict(target_translation=tt, target_rotation=trr)

def affine_inverse(A):
    "geometry.affine_inverse_np: [R t] -> [R^T, -R^T t] (exact only for orthonormal R)."
    out = A.copy(); Rt = np.swapaxes(A[..., :3, :3], -1, -2)
    out[..., :3, :3], out[..., :3, 3:] = Rt, -Rt @ A[..., :3, 3:]
    return out

def camera_motion_score(pred_c2w, target_c2w, seed=None):
    "_compute_camera_motion_score with the estimate given as c2w (DA3 gives w2c: inverted here in float32): score, info."
    pred_ext = np.stack([np.linalg.inv(p) for p in np.asarray(pred_c2w, np.float32)]).astype(np.float32)
    tgt = np.asarray(target_c2w, np.float32)[select_padded(len(target_c2w), len(pred_ext))]
    tgt_ext = np.stack([np.linalg.inv(p) for p in tgt]).astype(np.float32)              # :551-554
    n = min(len(pred_ext), len(tgt_ext))
    pred_ext, tgt_ext = pred_ext[select_padded(len(pred_ext), n)], tgt_ext[select_padded(len(tgt_ext), n)]
    tgt_rel = _rel(affine_inverse(tgt_ext))                                              # :563
    aligned, status = pred_ext, 'not aligned: static command'
    if _total_trans(tgt_rel[:, :3, 3]) >= 1e-4:
        try:
            ref, est = affine_inverse(tgt_ext), affine_inverse(pred_ext)                 # pose_align.py:76-81
            r, t, s = align_ransac(ref, est, seed=seed) if n >= 6 else umeyama(est[:, :3, 3].T, ref[:, :3, 3].T)
            aligned, status = affine_inverse(_apply(est, r, t, s)), 'sim3'               # pose_align.py:189-193
        except Degenerate as e: status = f'not aligned: {e}'
    score, info = motion_profile(_rel(affine_inverse(aligned)), tgt_rel)                 # :578-579
    return score, info | dict(alignment=status)

# --- flow_grpo/rewards.py:170-191 (R_gen's frame) ----------------------------------------------------------------------
def rgen_frame(videos, rng):
    "One random frame index shared by the whole batch, then 8-bit rounding."
    t = rng.randint(0, videos.shape[1] - 1)
    return t, np.clip(np.round(np.asarray(videos[:, t])*255), 0, 255).astype(np.uint8)

# --- reward_server/reward_3d.py:405-434 (S_recon with LPIPS) -----------------------------------------------------------
def s_recon(gs_video, input_video, lpips_fn):
    "1 - mean LPIPS of rendered frame k against input frame k, k < min of the two lengths, clipped to [0,1]."
    n = min(len(gs_video), len(input_video))
    d = lpips_fn(gs_video[:n]*2 - 1, input_video[:n]*2 - 1)
    return float(np.clip(1.0 - float(d.mean()), 0.0, 1.0))

# --- reward_server/reward_3d.py:224-234 (S_meta from digit logits) -----------------------------------------------------
def meta_expectation(digit_logits):
    p = np.exp(digit_logits - np.max(digit_logits)); p /= p.sum()
    return float((p*np.arange(10)).sum()/9.0)

# --- gs_renderer.py:212-221 and camera_trj_helpers.py:32-105 (the S_recon render path) ---------------------------------
def inter_len(n_views):
    il = 8
    total = (n_views - 1)*il
    if total > 24*18: il = max(1, 24*10//(n_views - 1))
    if total < 24*2: il = max(1, 24*2//(n_views - 1))
    return il

def gaussian_kernel(k):
    "cv2.getGaussianKernel(k, sigma=-1): sigma = 0.3((k-1)/2 - 1) + 0.8, normalised."
    sigma = 0.3*((k - 1)*0.5 - 1) + 0.8
    x = np.arange(k) - (k - 1)/2
    g = np.exp(-x**2/(2*sigma**2))
    return g/g.sum()

def stabilize(poses, k_size=50):
    "render_stabilization_path: Gaussian-smooth columns 0, 1 and 3 (reflect padding), renormalise, r3 = r1 x r2."
    n = len(poses)
    if n <= 1: return poses.copy()
    k = k_size + (k_size % 2 == 0)
    k = min(k, n if n % 2 else n - 1)
    if n >= 3 and k < 3: k = 3
    g, pad = gaussian_kernel(k), k//2
    cols = []
    for idx in (0, 1, 3):
        v = poses[:, :3, idx]
        vp = np.concatenate([v[1:pad + 1][::-1], v, v[-pad - 1:-1][::-1]]) if pad else v
        cols.append(np.stack([(vp[i:i + k]*g[:, None]).sum(0) for i in range(n)]))
    r1 = cols[0]/np.linalg.norm(cols[0], axis=1, keepdims=True)
    r2 = cols[1]/np.linalg.norm(cols[1], axis=1, keepdims=True)
    out = np.tile(np.eye(4), (n, 1, 1))
    out[:, :3, 0], out[:, :3, 1], out[:, :3, 2], out[:, :3, 3] = r1, r2, np.cross(r1, r2), cols[2]
    return out

def eased(n): return (np.cos(np.pi*(np.linspace(0, 1, n) + 1)) + 1)/2

# --- WorldReward: worldreward/aggregate.py majority, worldreward-bench/score.py evaluate ---------------------------------
def wr_majority(votes):
    votes = list(votes); a, b = votes.count('A'), votes.count('B')
    return 'A' if a > b else 'B' if b > a else 'Tie'

def wr_evaluate(bench, predictions, axes=('action', 'appearance', 'motion')):
    "Overall accuracy per axis in both denominators ('all', 'non-tie'): {axis: (correct, total, correct_nt, total_nt)}."
    modelled = {a for a in axes if any(p.get(a) is not None for p in predictions.values())}
    out = {a: [0, 0, 0, 0] for a in axes}
    for pair in bench:
        pred = predictions.get(pair['pair_id'])
        if pred is None: continue
        for a in axes:
            if a not in modelled: continue
            truth = (pair.get('label') or {}).get(a)
            if truth not in ('left', 'right', 'tie'): continue
            c = int(pred.get(a) == truth)
            out[a][0] += c; out[a][1] += 1
            if truth != 'tie': out[a][2] += c; out[a][3] += 1
    return out


# --- NVlabs/DiffusionNFT scripts/train_nft_sd3.py (return_decay; the loss after "Policy Gradient Loss") -------------------
def nft_return_decay(step, decay_type=1):
    "The old adapter's EMA decay after `step` gradient steps."
    flat, uprate, uphold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[decay_type]
    return 0.0 if step < flat else min((step - flat)*uprate, uphold)


def nft_loss(forward_prediction, old_prediction, ref_prediction, xt, x0, t, advantages, beta, adv_clip_max, train_beta):
    "The scalar loss of one micro-batch (numpy float64): the policy loss times adv_clip_max, plus train.beta x KL."
    f, o, ref, xt, x0 = (np.asarray(a, np.float64) for a in (forward_prediction, old_prediction, ref_prediction, xt, x0))
    B = len(x0); ax = tuple(range(1, x0.ndim)); te = np.asarray(t, np.float64).reshape(B, *[1]*(x0.ndim - 1))
    a = np.clip(np.asarray(advantages, np.float64), -adv_clip_max, adv_clip_max)
    r = np.clip((a/adv_clip_max)/2.0 + 0.5, 0, 1)
    positive_prediction = beta*f + (1 - beta)*o
    implicit_negative_prediction = (1.0 + beta)*o - beta*f
    x0_prediction = xt - te*positive_prediction
    weight_factor = np.clip(np.abs(x0_prediction - x0).mean(axis=ax, keepdims=True), 0.00001, None)
    positive_loss = ((x0_prediction - x0)**2/weight_factor).mean(axis=ax)
    negative_x0_prediction = xt - te*implicit_negative_prediction
    negative_weight_factor = np.clip(np.abs(negative_x0_prediction - x0).mean(axis=ax, keepdims=True), 0.00001, None)
    negative_loss = ((negative_x0_prediction - x0)**2/negative_weight_factor).mean(axis=ax)
    ori_policy_loss = r*positive_loss/beta + (1.0 - r)*negative_loss/beta
    policy_loss = (ori_policy_loss*adv_clip_max).mean()
    kl_div_loss = ((f - ref)**2).mean(axis=ax)
    return policy_loss + train_beta*kl_div_loss.mean()


# --- CodeGoat24/WorldReward diffusion_nft/fastvideo/ (utils/training_utils.py EMA_FSDP_schedule; -----------------------
# --- rewards/reward_dispatcher.py compute_advantages; rewards/computers/worldreward.py _pair_scores, _aggregate_win_rates)
def wr_policy_decay(step, min_decay=0.4, max_decay=0.9, step_decay=0.01):
    "update_policy_shadow's decay at training step `step` (1-based)."
    return min(max_decay, min_decay + step_decay*step)


def wr_compute_advantages(outputs, weights, prompt_of, std_type='global'):
    """total_advantages [N]: each output's (reward - its prompt group's mean)/std, weighted sum / sum of weights,
    then the z-score over everything (population stds + 1e-8). A gpu_group holds one prompt's rollouts."""
    prompt_of = np.asarray(prompt_of)
    weighted, sum_w = np.zeros(len(prompt_of)), 0.0
    for o, rewards in outputs.items():
        w = weights.get(o, 0.0)
        if w <= 0.0: continue
        rewards = np.asarray(rewards, np.float64)
        adv = np.zeros_like(rewards)
        for p in np.unique(prompt_of):
            g = rewards[prompt_of == p]
            group_std = g.std() + 1e-8
            if std_type == 'global': group_std = rewards.std() + 1e-8
            adv[prompt_of == p] = (g - g.mean())/group_std
        weighted += w*adv; sum_w += w
    raw = weighted/(sum_w if sum_w > 0 else 1.0)
    return (raw - raw.mean())/(raw.std() + 1e-8)


def wr_win_rates(n, pair_results):
    "Per-candidate win rates from (idx_i, idx_j, s_i, s_j) rows; a candidate with no judged pair gets 0.5."
    score, count = [0.0]*n, [0]*n
    for i, j, si, sj in pair_results:
        if si is not None and sj is not None:
            score[i] += si; score[j] += sj; count[i] += 1; count[j] += 1
    return [score[i]/count[i] if count[i] > 0 else 0.5 for i in range(n)]


def wr_pair_scores(prob_a, disp_a_idx, idx_i, idx_j):
    "(s_i, s_j) of a pair from P(the video shown as A wins)."
    return (prob_a, 1.0 - prob_a) if disp_a_idx == idx_i else (1.0 - prob_a, prob_a)


# --- Hongyang-Du/VideoGPA metrics/mvcs.py (MVCSMetric.compute, at fb86241) ---------------------------------------------
def videogpa_mvcs(depths, intrinsics, extrinsics):
    "Their loop as written: float32, integer pixel grid, u < W mask, grid_sample(align_corners=True), exp(-mean MSE)."
    import torch
    import torch.nn.functional as F
    depths, intrinsics, extrinsics = depths.float(), intrinsics.float(), extrinsics.float()
    T, H, W = depths.shape
    if extrinsics.shape[-2:] == (3, 4):
        extrinsics = torch.cat([extrinsics, torch.tensor([0, 0, 0, 1.]).reshape(1, 1, 4).expand(T, 1, 4)], dim=1)
    y, x = torch.meshgrid(torch.arange(H), torch.arange(W), indexing='ij')
    coords = torch.stack([x, y, torch.ones_like(x)], dim=-1).float().reshape(-1, 3).t()
    scores = []
    for i in range(T - 1):
        j = i + 1
        p_i = torch.inverse(intrinsics[i]) @ coords * depths[i].reshape(1, -1)
        rel = extrinsics[j] @ torch.inverse(extrinsics[i])
        p_j = rel[:3, :3] @ p_i + rel[:3, 3:4]
        homo = intrinsics[j] @ p_j
        z_proj = p_j[2, :].reshape(H, W)
        z = homo[2, :].clamp(min=1e-8)
        u, v = (homo[0, :]/z).reshape(H, W), (homo[1, :]/z).reshape(H, W)
        grid = torch.stack([2.0*u/(W - 1) - 1.0, 2.0*v/(H - 1) - 1.0], dim=-1).unsqueeze(0)
        sampled = F.grid_sample(depths[j].view(1, 1, H, W), grid, mode='bilinear', padding_mode='zeros',
                                align_corners=True).squeeze()
        mask = (u >= 0) & (u < W) & (v >= 0) & (v < H) & (z_proj > 0)
        if mask.any(): scores.append((sampled[mask] - z_proj[mask]).pow(2).mean().item())
    return float(np.exp(-np.mean(scores))) if scores else 0.0
