#!/usr/bin/env python3
"""make_tokenizer_golden.py — golden ids and chat renders from the HF reference (runs offline).

Needs python3 with `tokenizers`; `transformers` (apply_chat_template) or else `jinja2` for the chat renders.
Usage (from the repo root; .cache/qwen3-tokenizer comes from scripts/fetch_tokenizer.sh):
  python3 tools/make_tokenizer_golden.py \
      --tokenizer .cache/qwen3-tokenizer/tokenizer.json --config .cache/qwen3-tokenizer/tokenizer_config.json \
      --corpus tests/fixtures/tokenizer/corpus.jsonl --chat tests/fixtures/tokenizer/chat_cases.jsonl \
      --out tests/fixtures/tokenizer
Writes, each with a header line {"format": "q35-tok-golden", "version": 1, ...provenance}:
  golden_qwen3.jsonl      one JSON id list per corpus line (official Qwen3 tokenizer.json)
  golden_qwen3_re35.jsonl the same with the Qwen3.5 split regex (\\p{M}) put into a copy of that file
  chat_qwen3.jsonl        per chat case: {"text": rendered prompt, "ids": its ids} (Qwen3's chat template)
"""
import argparse
import hashlib
import json
import os
import platform
import sys

QWEN3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
            r"\s+(?!\S)|\s+")
QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_jsonl(path):
    with open(path, encoding="utf-8", newline="") as f:
        data = f.read()
    # split on "\n" only: lines may hold raw U+2028 / U+0085, which str.splitlines() would break on
    return [json.loads(line) for line in data.split("\n") if line]


def header(kind, args, extra):
    import tokenizers
    h = {"format": "q35-tok-golden", "version": 1, "kind": kind, "reference": "HF tokenizers (python)",
         "tokenizers_version": tokenizers.__version__, "python": platform.python_version(),
         "tokenizer_sha256": sha256(args.tokenizer), "corpus_sha256": sha256(args.corpus)}
    h.update(extra)
    return h


def write(path, head, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(head, ensure_ascii=False) + "\n")
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {path}: {len(rows)} rows")


def encode_all(tok, texts):
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def render_chat(args, cases):
    """Qwen3's chat template through transformers.apply_chat_template, else jinja2 set up as transformers does."""
    with open(args.config, encoding="utf-8") as f:
        cfg = json.load(f)
    template = cfg["chat_template"]
    out = []
    try:
        from transformers import PreTrainedTokenizerFast
        hf = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer, chat_template=template)
        how = "transformers " + __import__("transformers").__version__

        def render(c):
            kw = {} if c["enable_thinking"] is None else {"enable_thinking": c["enable_thinking"]}
            return hf.apply_chat_template(c["messages"], tokenize=False,
                                          add_generation_prompt=c["add_generation_prompt"], **kw)
    except Exception as e:  # no transformers: plain jinja2 with transformers' environment settings
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        print(f"transformers unavailable ({e}); rendering with jinja2 {jinja2.__version__}", file=sys.stderr)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        tpl = env.from_string(template)
        how = "jinja2 " + jinja2.__version__

        def render(c):
            kw = {} if c["enable_thinking"] is None else {"enable_thinking": c["enable_thinking"]}
            return tpl.render(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"],
                              bos_token="", eos_token=cfg.get("eos_token", ""), **kw)
    for c in cases:
        out.append(render(c))
    return out, how


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--chat", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    texts = read_jsonl(args.corpus)
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.tokenizer, encoding="utf-8") as f:
        j = json.load(f)
    split = j["pre_tokenizer"]["pretokenizers"][0]
    if split["pattern"].get("Regex") != QWEN3_RE:
        sys.exit("unexpected split regex in " + args.tokenizer)
    split["pattern"]["Regex"] = QWEN35_RE
    tok35 = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))

    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "golden_qwen3.jsonl"), header("ids", args, {"regex": "qwen3"}),
          encode_all(tok, texts))
    write(os.path.join(args.out, "golden_qwen3_re35.jsonl"), header("ids", args, {"regex": "qwen3.5"}),
          encode_all(tok35, texts))

    cases = read_jsonl(args.chat)
    rendered, how = render_chat(args, cases)
    rows = [{"text": r, "ids": tok.encode(r, add_special_tokens=False).ids} for r in rendered]
    write(os.path.join(args.out, "chat_qwen3.jsonl"),
          header("chat", args, {"renderer": how, "config_sha256": sha256(args.config)}), rows)


if __name__ == "__main__":
    main()
