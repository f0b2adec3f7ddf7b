"""The library's shape: its line limit, and layering (a module imports only the modules of lower-numbered notebooks)."""
import ast, re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 120                                     # [tool.ruff] line-length in pyproject.toml
LAZY_UPWARD = {('rewards', 'judge'),           # S_meta asks a VLM judge: imported inside s_meta only (08a -> 09)
               ('reward_service', 'judge'),    # `worldlab-rewards --judge URL` builds the judge's client (08b -> 09)
               ('runs', 'docs'),               # `worldlab docs` loads the Sphinx stack only when asked (91 -> 92)
               ('miniwan', 'adapters')}        # save_adapter / load_rl_adapter go through the adapter formats (11b -> 11d)


def modules():
    "module name -> (its notebook's sort key, source)"
    out = {}
    for nb in sorted((ROOT/'nbs').glob('[0-9]*.ipynb')):
        m = re.search(r'#\|\s*default_exp\s+(\w+)', nb.read_text())
        if m: out[m.group(1)] = (nb.stem, (ROOT/'worldlab'/f'{m.group(1)}.py').read_text())
    return out


def generated_lines(p:Path):
    "Numbers of the lines nbdev writes itself: the `__all__ = [...]` block, and `__init__.py`'s docstring line."
    lines, out, inside = p.read_text().splitlines(), set(), False
    for i, l in enumerate(lines, 1):
        if l.startswith('__all__ = ['): inside = True
        if inside: out.add(i)
        if inside and l.rstrip().endswith(']'): inside = False
    if p.name == '__init__.py': out.add(1)  # nbdev writes this docstring from pyproject.toml's description
    return out


def test_library_lines_are_within_the_limit():
    long = [f"{p.name}:{i}: {len(l)} chars" for p in sorted((ROOT/'worldlab').glob('*.py')) if p.name != '_modidx.py'
            for i, l in enumerate(p.read_text().splitlines(), 1) if len(l) > LIMIT and i not in generated_lines(p)]
    assert not long, f"{len(long)} lines over {LIMIT} characters (wrap them in the notebooks' export cells):\n" + '\n'.join(long[:40])


def test_modules_import_only_lower_notebooks():
    mods = modules()
    assert {'core', 'config', 'grpo', 'rewards', 'reward_contract'} <= set(mods), sorted(mods)
    bad = []
    for name, (key, src) in mods.items():
        tree = ast.parse(src)
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                dep = node.module.split('.')[0]
            elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('worldlab.'):
                dep = node.module.split('.')[1]
            else: continue
            if dep in mods and mods[dep][0] >= key and (id(node) in top or (name, dep) not in LAZY_UPWARD):
                bad.append(f"{name} ({key}) imports {dep} ({mods[dep][0]}) at line {node.lineno}")
    assert not bad, '\n'.join(bad)


def test_the_trainer_needs_only_the_reward_contract():
    src = (ROOT/'worldlab'/'grpo.py').read_text()
    assert 'from .reward_contract import' in src and 'from .rewards import' not in src
    assert 'from .warp import wan_latent_shape' not in (ROOT/'worldlab'/'policy.py').read_text()
