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
    "Prefers video A, in a code fence with prose around it; counts requests and images."
    calls, images = 0, []
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        content = body['messages'][0]['content']
        type(self).calls += 1
        type(self).images.append(sum(c['type'] == 'image_url' for c in content))
        text = 'Here is my review.\n```json\n' + json.dumps(verdict('A')) + '\n```'
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
        assert r.returncode == 0, r.stderr
        assert Judge.calls == 2                                          # resumed: accepted chunks are not asked again
    finally:
        server.shutdown()
