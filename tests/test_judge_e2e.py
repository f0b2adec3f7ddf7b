"End to end: `worldlab run judge_pairs` against an OpenAI-compatible judge served on loopback, resumed."
import json, subprocess, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLDLAB = Path(sys.executable).parent/'worldlab'


def verdict(w):
    acts = [dict(action_id=i + 1, action_label='x', video_a_analysis='a', video_b_analysis='b', winner=w) for i in range(4)]
    crit = dict(video_a_analysis='a', video_b_analysis='b', winner=w)
    return dict(action_control=dict(actions=acts, overall_summary='s', overall_winner=w),
                visual_quality=dict(temporal_consistency=crit, dynamic_generation_quality=crit,
                                    artifacts_and_structure_integrity=crit, overall_summary='s', overall_winner=w))


class Judge(BaseHTTPRequestHandler):
    "Prefers video A, in a code fence with prose around it (or, when `garbage`, prose only); counts requests and images."
    calls, images, garbage = 0, [], False
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        content = body['messages'][0]['content']
        type(self).calls += 1
        type(self).images.append(sum(c['type'] == 'image_url' for c in content))
        text = 'Here is my review.\n```json\n' + json.dumps(verdict('A')) + '\n```'
        if type(self).garbage: text = 'Both videos look fine to me.'
        data = json.dumps({'choices': [{'message': {'content': text}}]}).encode()
        self.send_response(200); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data))); self.end_headers(); self.wfile.write(data)


def test_judge_pairs_over_http_then_resume(tmp_path):
    server = ThreadingHTTPServer(('127.0.0.1', 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = [str(WORLDLAB), 'run', 'judge_pairs', '-p', 'backend', 'openai', '-p', 'base_url',
                f'http://127.0.0.1:{server.server_address[1]}/v1', '-p', 'max_tokens', '4096',
                '--out', str(tmp_path), '--run-id', 'r1', '--quiet']
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        d = tmp_path/'judge_pairs'/'r1'
        assert Judge.calls == 2 and Judge.images == [6, 6]               # one chunk per demo pair, six images each
        preds = [json.loads(l) for l in (d/'predictions.jsonl').read_text().splitlines()]
        assert all(p['action'] == p['appearance'] == p['motion'] == 'left' for p in preds)
        score = {row['slice']: row for row in json.loads((d/'score.json').read_text())}
        assert score['all']['action'] == 50.0                            # demo0 is labelled left, demo1 tie
        assert score['all']['action (non-tie)'] == 100.0
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 2 and '--force' in r.stderr, r.stderr       # a finished run is not run again by accident
        r = subprocess.run(args + ['--force'], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        assert Judge.calls == 2                                          # resumed: accepted chunks are not asked again

        bad = d/'demo'/'bad.jsonl'                                       # one malformed line among good ones
        bad.write_text((d/'demo'/'pairs.jsonl').read_text() + '{"pair_id": "demo2", \n')
        r = subprocess.run(args[:-5] + ['-p', 'pairs', str(bad), '--out', str(tmp_path), '--run-id', 'r2', '--quiet'],
                           cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        assert 'bad.jsonl:3' in r.stderr and 'skipped' in r.stderr, r.stderr   # said in the terminal ...
        m = json.loads((tmp_path/'judge_pairs'/'r2'/'metrics.json').read_text())
        assert m['pairs'] == 2 and len(m['pairs_skipped']) == 1 and 'bad.jsonl:3' in m['pairs_skipped'][0], m  # ... and kept

        Judge.garbage = True                                             # no reply parses: nothing could be judged
        r = subprocess.run(args[:-5] + ['--out', str(tmp_path), '--run-id', 'r3', '--quiet'],
                           cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 1 and 'no chunk could be judged' in r.stderr, r.stderr
        m = json.loads((tmp_path/'judge_pairs'/'r3'/'metrics.json').read_text())
        assert m['chunks_accepted'] == 0 and m['chunks_failed'] == 2, m
    finally:
        server.shutdown(); Judge.garbage = False


class Varied(Judge):
    ("A judge whose verdicts vary by request content and are the same whenever the same images come again (also from "
     "another run): the n-th distinct set of images seen gets verdict n, alternating sides. (A checksum of the encoded "
     "images, used before, gave every one of the four distinct requests the same verdict with another Pillow/zlib.)")
    seen = {}
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        urls = [c['image_url']['url'] for c in body['messages'][0]['content'] if c['type'] == 'image_url']
        n = type(self).seen.setdefault(''.join(urls), len(type(self).seen))
        v = verdict('AB'[n % 2])
        for i, a in enumerate(v['action_control']['actions']): a['winner'] = ('A', 'B', 'Tie')[(n + i) % 3]
        v['visual_quality']['temporal_consistency']['winner'] = 'Tie' if n % 3 == 2 else 'A'
        type(self).calls += 1
        data = json.dumps({'choices': [{'message': {'content': json.dumps(v)}}]}).encode()
        self.send_response(200); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data))); self.end_headers(); self.wfile.write(data)


def test_sharded_judge_pairs_merge_to_the_unsharded_result(tmp_path):
    "Seven pairs judged in one run, and in three shards merged: the same predictions and scores, each chunk judged once."
    server = ThreadingHTTPServer(('127.0.0.1', 0), Varied)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = [str(WORLDLAB), 'run', 'judge_pairs', '-p', 'backend', 'openai', '-p', 'base_url',
                f'http://127.0.0.1:{server.server_address[1]}/v1', '-p', 'max_tokens', '4096', '--out', str(tmp_path), '--quiet']
        run = lambda rid, *extra: subprocess.run(base + ['--run-id', rid, *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)
        r = run('demo'); assert r.returncode == 0, r.stderr                 # makes the demo's videos
        demo = tmp_path/'judge_pairs'/'demo'/'demo'
        two = [json.loads(l) for l in (demo/'pairs.jsonl').read_text().splitlines()]
        lines = []
        for k in range(7):                                                 # both demo pairs, in both side orders
            p = dict(two[k % 2], pair_id=f'p{k}')
            if k % 3 == 1: p['left'], p['right'] = p['right'], p['left']
            for key in ('input_image',): p[key] = str(demo/p[key])
            for side in ('left', 'right'): p[side] = dict(p[side], video=str(demo/p[side]['video']))
            lines.append(p)
        pairs = tmp_path/'bench.jsonl'; pairs.write_text(''.join(json.dumps(l) + '\n' for l in lines))
        Varied.calls = 0
        r = run('full', '-p', 'pairs', str(pairs)); assert r.returncode == 0, r.stderr
        full_calls, Varied.calls = Varied.calls, 0
        for k in range(3):
            r = run(f's{k}', '-p', 'pairs', str(pairs), '-p', 'shard', str(k), '-p', 'num_shards', '3')
            assert r.returncode == 0, r.stderr
        assert Varied.calls == full_calls == 7, (Varied.calls, full_calls)   # every chunk judged once, in one shard
        shards = ','.join(str(tmp_path/'judge_pairs'/f's{k}') for k in range(3))
        r = run('merged', '-p', 'pairs', str(pairs), '-p', 'merge', shards); assert r.returncode == 0, r.stderr
        assert Varied.calls == 7                                            # merging asks the judge nothing
        read = lambda rid: {p['pair_id']: p for p in map(json.loads, (tmp_path/'judge_pairs'/rid/'predictions.jsonl').read_text().splitlines())}
        full, merged = read('full'), read('merged')
        assert full == merged and len(full) == 7, (full, merged)
        assert len({(p['action'], p['appearance']) for p in full.values()}) > 1, full    # the verdicts do vary
        score = lambda rid: json.loads((tmp_path/'judge_pairs'/rid/'score.json').read_text())
        assert score('full') == score('merged')
        r = run('partial', '-p', 'pairs', str(pairs), '-p', 'merge', shards.rsplit(',', 1)[0])
        assert r.returncode == 1 and 'pairs in none of them' in r.stderr, r.stderr[-2000:]
    finally:
        server.shutdown()
