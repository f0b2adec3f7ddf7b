"""The reward service on loopback: served scores against in-process ones, every refusal's status and message,
cut-off slow and lying clients, batching, failover, a restart mid-run, and a reward that fails on one video.
Servers run in threads of this process (one in a subprocess, as `worldlab-rewards`), each on a free port."""
import contextlib, json, math, os, select, socket, subprocess, sys, threading, time, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import worldlab.reward_service as rs
from worldlab.reward_contract import per_video
from worldlab.reward_service import RewardServer, ServeLimits, parse_metrics, remote_reward

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def clip(seed:int, b:int=2, f:int=3, side:int=8) -> torch.Tensor:
    "Videos [b,f,3,side,side] of grey levels k/255: the uint8 transport carries them exactly."
    return torch.randint(0, 256, (b, f, 3, side, side), generator=torch.Generator().manual_seed(seed)) / 255


def red(videos, prompts, metas):
    "The in-process reward: each video's mean red, and its prompt back as a detail."
    return videos[:, :, 0].double().mean(dim=(1, 2, 3)), dict(prompt=list(prompts or ['']*len(videos)))


def same(a, b) -> bool: return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), rtol=0, atol=1e-12)


class Spy:
    "`red`, recording the number of videos of each call; it may wait (`delay`) or block until `gate` is set."
    def __init__(self, delay:float=0.0, gate:threading.Event|None=None):
        self.calls, self.delay, self.gate, self.lock = [], delay, gate, threading.Lock()
    def __call__(self, videos, prompts, metas):
        with self.lock: self.calls.append(len(videos))
        if self.gate is not None: assert self.gate.wait(30), 'the test never opened the gate'
        time.sleep(self.delay)
        return red(videos, prompts, metas)


@contextlib.contextmanager
def serving(registry:dict, token=None, port:int=0, **limits):
    srv = RewardServer(registry, port=port, token=token, limits=ServeLimits(**limits)).start()
    try: yield srv
    finally: srv.stop()


def scrape(srv, token=None) -> dict:
    req = urllib.request.Request(srv.url + '/metrics', headers={'Authorization': f'Bearer {token}'} if token else {})
    return parse_metrics(urllib.request.urlopen(req, timeout=10).read().decode())


def post(url:str, body:bytes, headers:dict|None=None) -> tuple[int, dict, dict]:
    "(status, decoded JSON reply, headers) of one POST, refusals included."
    req = urllib.request.Request(url, body, {'Content-Type': 'application/json', **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r: return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read()), e.headers


def request_body(videos, exact=False, **kw) -> bytes:
    return json.dumps(dict(videos=rs._encode_videos(videos, exact) if torch.is_tensor(videos) else videos, **kw)).encode()


def raw_exchange(port:int, head:bytes, parts=(), gap:float=0.0, timeout:float=15.0) -> tuple[bytes, bool]:
    "Send `head` then each of `parts` (`gap` s apart, while the server listens); the reply, and whether it closed."
    s, reply = socket.create_connection(('127.0.0.1', port), timeout=timeout), b''
    try:
        s.sendall(head)
        for p in parts:
            try: s.sendall(p)
            except OSError: break                     # the server has already answered and closed
            if select.select([s], [], [], gap)[0]: break    # it answers: stop sending, read
        while True:
            try: chunk = s.recv(65536)
            except ConnectionResetError: return reply, True
            if not chunk: return reply, True
            reply += chunk
    except socket.timeout: return reply, False
    finally: s.close()


def status_of(reply:bytes) -> int: return int(reply.split(b' ', 2)[1]) if reply else 0


def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------- correctness

def test_worldlab_rewards_serves_what_runs_in_process():
    from worldlab.camera import chain_trajectory
    from worldlab.core import to_float
    from worldlab.scenes import make_world, render_video
    from worldlab.rewards import make_rewards
    traj = chain_trajectory(['push_in'], 5, 32, 32)
    video = to_float(render_video(make_world('micro_still_life', seed=0), traj))[None]
    p = subprocess.Popen([str(BIN/'worldlab-rewards'), '--rewards', 's_recon,s_traj', '--lpips', 'random', '--port', '0'],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, 'OMP_NUM_THREADS': '1'})
    threads = torch.get_num_threads()
    try:
        line = p.stdout.readline()
        assert 'serving' in line, (line, p.stderr.read() if p.poll() is not None else '')
        url = line.split(' at ')[-1].strip()
        there, info = remote_reward(url, 's_traj', exact=True)(video, ['Camera push in.'], [{'traj': traj}])
        torch.set_num_threads(1)                      # the server is idle now; one thread each avoids oversubscription
        here, _ = make_rewards(lpips='random')['s_traj'](video, ['Camera push in.'], [{'traj': traj}])
        assert abs(float(there[0]) - float(here[0])) < 1e-6, f"served {float(there[0])} vs in-process {float(here[0])}"
        assert info['s_traj/alignment'][0].startswith('sim3'), info
    finally:
        torch.set_num_threads(threads)
        p.terminate(); p.wait(timeout=30)


def test_concurrent_requests_are_batched_and_each_gets_its_own_scores():
    spy = Spy(delay=0.05)
    clips = [clip(i) for i in range(48)]
    with serving({'red': spy}, max_batch=8, max_wait=0.05) as srv:
        fn = remote_reward(srv.url, 'red')
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda i: fn(clips[i], [f'p{i}a', f'p{i}b'], None), range(len(clips))))
        m = scrape(srv)
    for i, (s, info) in enumerate(got):
        want = red(clips[i], None, None)[0]
        assert same(s, want), f"request {i}: served {s.tolist()} vs in-process {want.tolist()}"
        assert info['prompt'] == [f'p{i}a', f'p{i}b'], (i, info)
    assert sum(spy.calls) == 96 and max(spy.calls) <= 8, f"videos per call {spy.calls} (96 in all, at most 8 each)"
    assert len(spy.calls) < 48, f"{len(spy.calls)} calls for 48 concurrent requests: nothing was batched"
    assert m['worldlab_reward_batch_requests_sum{reward="red"}'] == 48, m
    assert m['worldlab_reward_batch_requests_count{reward="red"}'] == len(spy.calls), (m, spy.calls)
    assert m['worldlab_reward_requests_total{code="200",reward="red"}'] == 48, m
    assert m['worldlab_reward_videos_total{reward="red"}'] == 96, m
    assert m['worldlab_reward_latency_seconds_count{reward="red"}'] == 48, m


def test_batching_off_and_mixed_shapes_score_each_request_as_it_is():
    spy = Spy(delay=0.02)
    clips = [clip(i, b=1 + i % 3, side=8 if i % 2 else 16) for i in range(12)]
    for limits, one_per_call in ((dict(max_batch=0), True), (dict(max_batch=32, max_wait=0.05), False)):
        spy.calls.clear()
        with serving({'red': spy}, **limits) as srv:
            with ThreadPoolExecutor(6) as pool:
                got = list(pool.map(lambda c: remote_reward(srv.url, 'red')(c, None, None)[0], clips))
        for c, s in zip(clips, got):
            assert same(s, red(c, None, None)[0]), f"served {s.tolist()} vs in-process {red(c, None, None)[0].tolist()}"
        assert sum(spy.calls) == sum(len(c) for c in clips), spy.calls
        if one_per_call: assert sorted(spy.calls) == sorted(len(c) for c in clips), f"batching off, yet calls {spy.calls}"


# ---------------------------------------------------------------------------------------------------- refusals

REFUSALS = [   # (name, limits, body or (videos, kwargs), status, field, words in the message)
    ('too many videos', dict(max_videos=2), (clip(0, b=3), {}), 422, 'videos', '(limit: 2)'),
    ('too many frames', dict(max_frames=2), (clip(0, f=3), {}), 422, 'frames', '3 is outside 1..2'),
    ('too tall', dict(max_side=4), (clip(0, side=8), {}), 422, 'height', '(limit: 4)'),
    ('NaN frame', {}, (clip(0).index_put((torch.tensor([1]), torch.tensor([2])), torch.tensor(math.nan)), dict(exact=True)),
     422, 'videos[1] frame 2', 'NaN'),
    ('out of range', {}, (clip(0)*2, dict(exact=True)), 422, 'videos[0] frame 0', 'outside [0, 1]'),
    ('wrong shape', {}, (torch.rand(2, 3, 8, 8), dict(exact=True)), 422, 'videos', 'is not [B,F,H,W,3]'),
    ('prompts', {}, (clip(0), dict(prompts=['one'])), 422, 'prompts', 'list of 2 strings'),
    ('no videos', {}, b'{"prompts": []}', 422, 'videos', 'missing'),
    ('not base64', {}, b'{"videos": "%%%"}', 422, 'videos', 'base64'),
    ('protocol', {}, (clip(0), dict(protocol=9)), 422, 'protocol', 'speaks 1'),
    ('malformed JSON', {}, b'{"videos": [1, 2', 400, 'body', 'is not JSON'),
    ('not an object', {}, b'[1, 2]', 400, 'body', 'JSON object'),
]


def test_bad_input_is_refused_naming_field_and_limit_and_the_server_keeps_serving():
    for name, limits, body, status, field, words in REFUSALS:
        with serving({'red': red}, **limits) as srv:
            if isinstance(body, tuple): body = request_body(body[0], **body[1])
            code, reply, _ = post(srv.url + '/score/red', body)
            assert (code, reply.get('field')) == (status, field) and words in reply['error'], f"{name}: {code} {reply}"
            ok, good, _ = post(srv.url + '/score/red', request_body(clip(1, b=1, f=1, side=4)))
            assert ok == 200 and good['scores'] == red(clip(1, b=1, f=1, side=4), [''], [{}])[0].tolist(), (name, ok, good)
            assert scrape(srv)['worldlab_reward_failures_total{kind="invalid"}'] == 1, name


def test_unknown_reward_and_path_are_404_naming_what_is_served():
    with serving({'red': red, 'green': red}) as srv:
        code, reply, _ = post(srv.url + '/score/hps', request_body(clip(0)))
        assert code == 404 and "no reward 'hps'" in reply['error'] and "['green', 'red']" in reply['error'], reply
        code, reply, _ = post(srv.url + '/nowhere', b'{}')
        assert code == 404 and '/score/<name>' in reply['error'], reply
        with pytest.raises(RuntimeError, match="no reward 'hps'"): remote_reward(srv.url, 'hps')(clip(0), None, None)


def test_a_body_over_the_limit_is_413_before_it_is_read():
    with serving({'red': red}, max_body_mb=0.01) as srv:    # 10 KiB
        head = (b'POST /score/red HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                b'Content-Length: 1000000000000\r\n\r\n')
        reply, closed = raw_exchange(srv.port, head, [b'{"videos": "'])
        assert status_of(reply) == 413 and b'Content-Length 1000000000000 bytes' in reply and b'10485 bytes' in reply, reply
        assert closed, 'the connection stayed open after 413'
        chunk = b'x'*4096
        chunked = b'POST /score/red HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n'
        reply, closed = raw_exchange(srv.port, chunked, [b'1000\r\n' + chunk + b'\r\n']*4)
        assert status_of(reply) == 413 and b'longer than the limit' in reply, reply
        code, good, _ = post(srv.url + '/score/red', request_body(clip(2, b=1, f=1, side=4)))
        assert code == 200 and good['scores'] == red(clip(2, b=1, f=1, side=4), [''], [{}])[0].tolist(), good
        assert scrape(srv)['worldlab_reward_failures_total{kind="body_too_large"}'] == 2


def test_lying_and_slow_clients_are_cut_off_while_another_is_served():
    with serving({'red': red}, body_timeout=1.0, header_timeout=1.0) as srv:
        head = b'POST /score/red HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n'
        out = {}
        clients = [threading.Thread(target=lambda k=k, a=a: out.__setitem__(k, raw_exchange(srv.port, *a))) for k, a in (
            ('liar', (head % 1000, [b'{"videos": "'])), ('slow', (head % 200, [b'{']*40, 0.25)),
            ('half head', (b'POST /score/red HTTP/1.1\r\nHo',)), ('slow head', (b'POST /score/red HTTP/1.1\r\n', [b'X']*40, 0.25)))]
        for c in clients: c.start()
        time.sleep(0.2)                               # all four are now holding a connection
        served = remote_reward(srv.url, 'red')(clip(3), None, None)[0]
        assert not out, f"{list(out)} finished before the good client was served"
        assert same(served, red(clip(3), None, None)[0]), f"served {served.tolist()}"
        for c in clients: c.join(20)
        for who in ('half head', 'slow head'):
            assert out[who] == (b'', True), f"{who}: {out[who]} (expected: closed without an answer)"
        for who in ('liar', 'slow'):
            reply, closed = out[who]
            assert status_of(reply) == 408 and b'did not arrive within 1 s' in reply, (who, reply)
            assert closed, f"{who}: the connection stayed open after 408"
        assert scrape(srv)['worldlab_reward_failures_total{kind="body_timeout"}'] == 2


def test_a_token_is_required_and_checked():
    with pytest.raises(ValueError, match='a bearer token is required'): RewardServer({'red': red}, host='0.0.0.0', port=0)
    r = subprocess.run([str(BIN/'worldlab-rewards'), '--host', '0.0.0.0', '--port', '0'], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != 'WORLDLAB_REWARD_TOKEN'}, timeout=120)
    assert r.returncode == 2 and 'give --token' in r.stderr, (r.returncode, r.stderr[-500:])
    with serving({'red': red}, token='s3cret') as srv:
        for headers in ({}, {'Authorization': 'Bearer guess'}, {'Authorization': 's3cret'}):
            code, reply, hs = post(srv.url + '/score/red', request_body(clip(0)), headers)
            assert code == 401 and reply['field'] == 'authorization' and hs.get('www-authenticate') == 'Bearer', (headers, code, reply)
        with pytest.raises(urllib.error.HTTPError, match='401'): urllib.request.urlopen(srv.url + '/metrics')
        assert json.loads(urllib.request.urlopen(srv.url + '/health').read())['auth'] is True
        s, _ = remote_reward(srv.url, 'red', token='s3cret')(clip(0), None, None)
        assert same(s, red(clip(0), None, None)[0]), s
        assert scrape(srv, 's3cret')['worldlab_reward_failures_total{kind="unauthorized"}'] == 4


# ---------------------------------------------------------------------------------------------------- load and faults

def test_a_full_queue_is_503_with_retry_after_and_the_client_waits_and_retries():
    gate = threading.Event()
    spy = Spy(gate=gate)
    with serving({'red': spy}, max_batch=0, max_queue=1, retry_after=1) as srv:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(remote_reward(srv.url, 'red'), clip(0), None, None)
            while not spy.calls: time.sleep(0.01)           # the first is being scored, blocked at the gate
            second = pool.submit(remote_reward(srv.url, 'red'), clip(1), None, None)
            while scrape(srv).get('worldlab_reward_queue_depth{reward="red"}') != 1: time.sleep(0.01)
            code, reply, hs = post(srv.url + '/score/red', request_body(clip(2)))
            assert code == 503 and hs.get('retry-after') == '1' and reply['limit'] == 1, (code, reply, hs)
            threading.Timer(0.5, gate.set).start()
            third = remote_reward(srv.url, 'red', backoff=0.05)(clip(2), None, None)[0]   # 503 first, then scored
            for c, s in ((0, first.result(30)[0]), (1, second.result(30)[0]), (2, third)):
                assert same(s, red(clip(c), None, None)[0]), f"clip {c}: served {s.tolist()}"
        m = scrape(srv)
    assert m['worldlab_reward_failures_total{kind="queue_full"}'] >= 2, m        # the raw POST and the client's try
    assert m['worldlab_reward_requests_total{code="200",reward="red"}'] == 3, m


def test_the_client_honours_retry_after(monkeypatch):
    answers = iter([(503, 'HTTP 503: busy', 2.5), (None, 'ConnectionRefusedError', 0.0), (200, {'ok': 1}, 0.0)])
    slept = []
    monkeypatch.setattr(rs, '_post_once', lambda *a: next(answers))
    monkeypatch.setattr(rs.time, 'sleep', slept.append)
    assert rs.post_any(['http://a', 'http://b'], '/score/x', b'{}', backoff=0.1) == {'ok': 1}
    assert slept == [2.5], f"slept {slept}: the client must wait the 2.5 s it was told before its second round"


def test_a_request_not_scored_in_time_is_504():
    gate = threading.Event()
    with serving({'red': Spy(gate=gate)}, request_timeout=0.5) as srv:
        code, reply, _ = post(srv.url + '/score/red', request_body(clip(0)))
        gate.set()
        assert code == 504 and reply['limit'] == 0.5 and 'not scored within 0.5 s' in reply['error'], (code, reply)


def test_failover_across_two_urls_with_one_down():
    dead = f"http://127.0.0.1:{free_port()}"
    with serving({'red': red}) as srv:
        fn = remote_reward([dead, srv.url], 'red', backoff=0.01)
        for i in range(6):
            s, _ = fn(clip(i), None, None)
            assert same(s, red(clip(i), None, None)[0]), f"request {i}: served {s.tolist()}"
        assert scrape(srv)['worldlab_reward_requests_total{code="200",reward="red"}'] == 6
        spread = remote_reward(f"{srv.url},{srv.url}/", 'red')        # several URLs as one string (RunConfig.reward_url)
        assert same(spread(clip(0), None, None)[0], red(clip(0), None, None)[0])
    with pytest.raises(RuntimeError, match='after 2 rounds') as e:
        remote_reward([dead, srv.url], 'red', retries=1, backoff=0.01)(clip(0), None, None)
    assert dead in str(e.value) and srv.url in str(e.value), str(e.value)


def test_a_restart_mid_run_gives_the_same_scores_and_counts_nothing_twice():
    port, n, results = free_port(), 12, []
    first = RewardServer({'red': Spy(delay=0.02)}, port=port).start()
    fn = remote_reward(f"http://127.0.0.1:{port}", 'red', retries=8, backoff=0.05)
    client = threading.Thread(target=lambda: results.extend(fn(clip(i), None, None)[0] for i in range(n)))
    client.start()
    while len(results) < 4: time.sleep(0.005)
    first.stop()                                        # requests in progress are answered, then the port closes
    time.sleep(0.3)                                     # the client meets a closed port and retries
    second = RewardServer({'red': Spy(delay=0.02)}, port=port).start()
    client.join(60)
    try:
        assert len(results) == n, f"{len(results)} results for {n} requests"
        for i, s in enumerate(results):
            assert same(s, red(clip(i), None, None)[0]), f"request {i}: served {s.tolist()} vs {red(clip(i), None, None)[0].tolist()}"
        a = first.metrics.requests.labels('red', '200')._value.get()
        b = scrape(second)['worldlab_reward_requests_total{code="200",reward="red"}']
        assert a + b == n and a >= 4 and b >= 1, f"answered {a} before the restart and {b} after, for {n} requests"
    finally: second.stop()


def test_a_video_that_raises_is_nan_with_its_reason_and_the_rest_are_scored():
    def fussy(videos, prompts, metas):          # raises on any batch holding a bad prompt (not written with per_video)
        if any('bad' in p for p in prompts): raise ValueError(f"cannot score {[p for p in prompts if 'bad' in p]}")
        return red(videos, prompts, metas)
    def careful(videos, prompts, metas):        # the reward_contract's way: per_video
        return per_video(videos, prompts, metas, lambda v, p, m: (float(red(v[None], [p], [m])[0]), {}) if 'bad' not in p
                         else (_ for _ in ()).throw(ValueError('bad prompt')))
    def buggy(videos, prompts, metas):          # a bug (TypeError) on one prompt
        return red(videos, prompts, metas)[0] * (1 if 'boom' not in prompts else None), {}
    reqs = [(clip(i), [f'ok{i}', 'bad' if i == 1 else f'ok{i}']) for i in range(4)]
    with serving({'fussy': fussy, 'careful': careful, 'buggy': buggy}, max_wait=0.1) as srv:
        for name in ('fussy', 'careful'):
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda r: remote_reward(srv.url, name)(r[0], r[1], None), reqs))
            for i, (s, info) in enumerate(got):
                want = red(reqs[i][0], None, None)[0]
                if i == 1:
                    assert math.isnan(s[1]) and s[0] == want[0] and 'bad' in info['reason'][1], (name, s, info)
                else: assert same(s, want), f"{name} request {i}: served {s.tolist()} vs {want.tolist()}"
        with ThreadPoolExecutor(2) as pool:
            boom = pool.submit(remote_reward(srv.url, 'buggy'), clip(0), ['a', 'boom'], None)
            fine = pool.submit(remote_reward(srv.url, 'buggy'), clip(1), ['a', 'b'], None)
            assert same(fine.result(30)[0], red(clip(1), None, None)[0])
            with pytest.raises(RuntimeError, match='HTTP 500.*buggy failed: TypeError'): boom.result(30)
        m = scrape(srv)
    assert m['worldlab_reward_nan_videos_total{reward="fussy"}'] == 1 and m['worldlab_reward_nan_videos_total{reward="careful"}'] == 1, m
    assert m['worldlab_reward_failures_total{kind="reward_error"}'] == 1, m


def test_grpo_on_the_tiny_preset_trains_the_same_on_served_rewards(tmp_path):
    "The trainer's client as `RunConfig.reward_url` uses it (two URLs, the first down) against the same reward in process."
    from worldlab.config import resolve
    from worldlab.core import to_float, to_uint8
    from worldlab.reward_contract import channel_mean_reward
    from worldlab.train import make_trainer, train
    served_red = channel_mean_reward(0)                       # served under a name the trainer does not score itself
    with serving({'s_traj': served_red}) as srv:
        over = dict(height=32, width=32, num_frames=5, steps=2, reward_weights={'s_traj': 1.0},
                    reward_url=f"http://127.0.0.1:{free_port()},{srv.url}")
        there = train(resolve('tiny', over), tmp_path/'served', progress=False)
        n_served = scrape(srv)['worldlab_reward_requests_total{code="200",reward="s_traj"}']
        trainer = make_trainer(resolve('tiny', over), tmp_path/'local')
        calls = []
        def local(v, p, m):         # what the server sees: the videos through uint8, contiguous (float32 sums follow layout)
            calls.append(len(v)); return served_red(to_float(to_uint8(v)).contiguous(), p, m)
        trainer.registry['s_traj'] = local
        here = train(resolve('tiny', over), tmp_path/'local', progress=False, trainer=trainer)
        assert scrape(srv)['worldlab_reward_requests_total{code="200",reward="s_traj"}'] == n_served, 'the local run asked the server'
    assert n_served == len(calls) > 0 and len(there) == len(here) == 2, f"{n_served} served requests, {len(calls)} local calls"

    for col in ('reward_mean', 'policy_loss', 'kl', 'grad_norm'):
        assert (there[col] - here[col]).abs().max() < 1e-9, (col, there[col].tolist(), here[col].tolist())
