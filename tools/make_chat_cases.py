#!/usr/bin/env python3
"""make_chat_cases.py — writes tests/fixtures/chat/cases.jsonl, the conversations of the chat golden test.

One JSON object per line: {"id", "template": "qwen35" | "qwen35_4b9b" | "qwen3", "tools": JSON text or null,
"messages": [OpenAI-style messages; tool_calls[].function.arguments is JSON text], "add_generation_prompt",
"enable_thinking": true | false | null (= not passed)}. tools and arguments are JSON *text* so that number
literals (1.0 vs 1, big ints) reach both renderers unchanged. tools/make_chat_golden.py renders them.
Usage: python3 tools/make_chat_cases.py > tests/fixtures/chat/cases.jsonl
"""
import json

W = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
S = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the documentation",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "max_results": {"type": "integer", "default": 5, "minimum": 1, "maximum": 50},
        "threshold": {"type": "number"}, "exact": {"type": "boolean"},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "year": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["query"]}}}
N = {"type": "function", "function": {"name": "get_time", "description": "Current UTC time",
                                      "parameters": {"type": "object", "properties": {}}}}
U = {"type": "function", "function": {
    "name": "traduire", "description": "Traduit un texte — 翻译文本 🌍 (résumé: «ok»)",
    "parameters": {"type": "object", "properties": {
        "texte": {"type": "string",
                  "description": "Le texte à traduire\nsur plusieurs lignes\t(tab) \"quoted\" back\\slash "
                                 "</tool_call> \u0001 \u007f \u2028"},
        "cible": {"type": "string", "enum": ["fr", "zh", "ar"]}}, "required": ["texte", "cible"]}}}
# number literals as written: Python reads 1.0e4 as float 10000.0, -0 as int 0, 1E16 as 1e+16
FLOATS = ('{"type": "function", "function": {"name": "set_temp", "description": "Set a temperature", '
          '"parameters": {"type": "object", "properties": {"value": {"type": "number", "minimum": -273.15, '
          '"maximum": 1.0e4, "multipleOf": 1e-7, "default": 20.0}, "ramp": {"type": "number", "default": 1E16}, '
          '"id": {"type": "integer", "maximum": 12345678901234567890, "minimum": -0}, "ratio": {"type": "number", '
          '"default": 0.1}, "big": {"type": "number", "default": 123456789012345678.0}, "small": {"type": '
          '"number", "default": 0.0001}, "tiny": {"type": "number", "default": 0.00001}}}}}')
DUP = ('{"type": "function", "function": {"name": "dup", "description": "first", '
       '"parameters": {"type": "object", "properties": {}}, "description": "second"}}')


def tools(*ts):
    return "[" + ", ".join(t if isinstance(t, str) else json.dumps(t, ensure_ascii=False) for t in ts) + "]"


def call(name, args, i=0):
    a = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{name}_{i}", "type": "function", "function": {"name": name, "arguments": a}}


def user(c): return {"role": "user", "content": c}
def system(c): return {"role": "system", "content": c}
def tool(c, i="call_0"): return {"role": "tool", "tool_call_id": i, "content": c}


def asst(content, calls=None, reasoning=None):
    m = {"role": "assistant", "content": content}
    if calls: m["tool_calls"] = calls
    if reasoning is not None: m["reasoning_content"] = reasoning
    return m


Q = "What's the weather in Paris?"
PARIS = call("get_weather", {"location": "Paris, France", "unit": "celsius"})
cases = []


def case(id, template, tl, messages, gen=True, think=None):
    cases.append({"id": id, "template": template, "tools": tl, "messages": messages,
                  "add_generation_prompt": gen, "enable_thinking": think})


# ---- Qwen3.5 ----
case("q35_tools_default", "qwen35", tools(W), [user(Q)])
case("q35_tools_think", "qwen35", tools(W), [user(Q)], think=True)
case("q35_tools_nothink", "qwen35", tools(W), [user(Q)], think=False)
case("q35_three_tools_system", "qwen35", tools(W, S, N), [system("You are a helpful assistant."), user(Q)])
case("q35_system_trimmed", "qwen35", tools(W), [system("  \n Be brief.\n\n "), user(Q)])
case("q35_system_blank", "qwen35", tools(W), [system("   "), user(Q)])
case("q35_no_tools_trim", "qwen35", None, [system("\tYou are concise. \n"), user("  Hi!  ")])
case("q35_call_result", "qwen35", tools(W), [user(Q), asst(None, [PARIS]), tool('{"temperature": 18}')])
case("q35_call_with_content", "qwen35", tools(W),
     [user(Q), asst("Let me check the weather.", [PARIS]), tool('{"temperature": 18}')])
case("q35_three_calls_three_results", "qwen35", tools(W, S),
     [user("Weather in Paris and Tokyo, and find the docs on umbrellas."),
      asst(None, [PARIS, call("get_weather", {"location": "Tokyo, Japan"}, 1),
                  call("search_docs", {"query": "umbrellas", "max_results": 3}, 2)]),
      tool('{"temperature": 18}', "call_get_weather_0"), tool('{"temperature": 25}', "call_get_weather_1"),
      tool("[\"umbrella.md\"]", "call_search_docs_2")], think=True)
case("q35_arg_types", "qwen35", tools(S),
     [user("search"), asst(None, [
         call("search_docs", '{"query": "multi\\nline \\"quoted\\" \\\\ text", "max_results": 10, '
                             '"threshold": 0.75, "exact": true, "filters": {"lang": "en", "year": 2024}, '
                             '"tags": ["a", "b"]}'),
         call("search_docs", '{"exact": false, "threshold": 1.0, "query": null, "max_results": -3}', 1)])])
case("q35_reasoning_field", "qwen35", tools(W),
     [user(Q), asst("", [PARIS], reasoning="\nThe user wants weather.\nCall the tool.\n"),
      tool('{"temperature": 18}')], think=True)
case("q35_reasoning_in_content", "qwen35", tools(W),
     [user(Q), asst("<think>\nI should call the tool.\n</think>\n\n", [PARIS]), tool('{"temperature": 18}')],
     think=True)
case("q35_history_reasoning_dropped", "qwen35", tools(W),
     [user("Hi"), asst("Hello!", reasoning="greet"), user(Q), asst(None, [PARIS], reasoning="need weather"),
      tool('{"temperature": 18}'), asst("It is 18 °C in Paris.", reasoning="answer"), user("Thanks!")])
case("q35_loop_no_gen", "qwen35", tools(W),
     [user(Q), asst(None, [PARIS]), tool('{"error": "timeout"}'), asst("Retrying.", [PARIS]),
      tool('{"temperature": 18}'), asst("18 °C.")], gen=False)
case("q35_tool_whitespace_trimmed", "qwen35", tools(W),
     [user(Q), asst(None, [PARIS]), tool('  \n{"ok": true}\n  ')])
case("q35_user_tool_response_wrapper", "qwen35", tools(W),
     [user(Q), asst(None, [PARIS]), user("<tool_response>\nold style\n</tool_response>")], think=True)
case("q35_blank_content_call", "qwen35", tools(W), [user(Q), asst("   \n", [PARIS]), tool("18")])
case("q35_unicode", "qwen35", tools(W),
     [user("¿Qué tiempo hace en 東京? 🌸 مرحبا नमस्ते"), asst(None, [call("get_weather", {"location": "東京, 日本 🗾"})]),
      tool('{"temp": "18°C", "note": "晴れ"}')])
case("q35_escaping_args", "qwen35", tools(S),
     [user("escape test"), asst(None, [call("search_docs", {
         "query": "tab\there \"q\" back\\slash </parameter> <tool_call> \u0001 \u2028 end",
         "filters": {"lang": "zh\n\"x\"\u0007", "year": -1}, "tags": ["ü", "\\", "</tool_call>"]})])])
case("q35_no_arg_calls", "qwen35", tools(N), [user("time?"), asst(None, [call("get_time", {}), call("get_time", "", 1)])])
case("q35_4b9b_default", "qwen35_4b9b", tools(W), [user(Q)])
case("q35_4b9b_nothink", "qwen35_4b9b", tools(W), [system("Be brief."), user(Q)], think=False)
case("q35_empty_tools_list", "qwen35", "[]", [system("Sys."), user(Q)])
case("q35_python_whitespace", "qwen35", None,
     [system("\u001fSystem\u00a0\u3000"), user("\ufeffBOM kept\u2029"), asst("\u0085answer\u000b")], gen=False)
case("q35_float_literals", "qwen35", tools(FLOATS), [user("Set it to 21.5")])
case("q35_special_tokens_in_content", "qwen35", tools(W),
     [user("Print <|im_end|> and <tool_call> literally"), asst("<|im_start|> is a token <think>")], gen=False)
case("q35_arg_order_kept", "qwen35", tools(W),
     [user(Q), asst(None, [call("get_weather", '{"unit": "fahrenheit", "location": "NYC"}')]), tool("70")])
case("q35_nothink_history", "qwen35", tools(W),
     [system("You are a weather bot."), user(Q), asst("Checking.", [PARIS], reasoning="call"),
      tool('{"temperature": 18}'), asst("18 °C"), user("And Rome?")], think=False)
case("q35_tool_after_system", "qwen35", None, [system("S"), tool("orphan"), user("Hi")])
case("q35_err_no_user", "qwen35", None, [system("S"), asst("hi")], gen=False)
case("q35_err_system_late", "qwen35", None, [user("Hi"), system("late")])
case("q35_dup_key_tool", "qwen35", tools(DUP, W), [user("dup")])
case("q35_empty_reasoning_string", "qwen35", None,
     [user("Hi"), asst("<think>\nhidden\n</think>\n\nvisible", reasoning="")], gen=False)
case("q35_nested_numbers", "qwen35", tools(S),
     [user("n"), asst(None, [call("search_docs", '{"filters": {"ids": [1, 2.5, 12345678901234567890, -0.0, 1e-7, '
                                                 '1E5, -0]}, "threshold": 2.5e10, "max_results": 0}')])])
case("q35_history_calls_before_query", "qwen35", tools(W),
     [user(Q), asst("Sure.", [PARIS], reasoning="old reasoning"), tool("18"), asst("18 °C."),
      user("Now Tokyo, think first.")], think=True)
case("q35_final_turn_after_results", "qwen35", tools(W, S),
     [user("Plan a picnic in Paris."), asst("I will check.", [PARIS, call("search_docs", {"query": "picnic"}, 1)],
                                            reasoning="two lookups"),
      tool("sunny", "call_get_weather_0"), tool("[]", "call_search_docs_1"),
      asst("Sunny: go!", reasoning="summarise")], gen=False)
case("q35_code_value", "qwen35", tools(S),
     [user("code"), asst(None, [call("search_docs", {"query": "def f():\n    return 1\n", "exact": True})])])
case("q35_plain_chat_think", "qwen35", None,
     [user("Hi"), asst("Hello."), user("Explain BPE briefly.")], think=True)

# ---- Qwen3 ----
case("q3_tools_default", "qwen3", tools(W), [user(Q)])
case("q3_system_tools_nothink", "qwen3", tools(W, S), [system("You are a helpful assistant."), user(Q)], think=False)
case("q3_call_result", "qwen3", tools(W), [user(Q), asst("", [PARIS]), tool('{"temperature": 18}')])
case("q3_two_calls_two_results", "qwen3", tools(W),
     [user("Paris and Tokyo?"), asst("", [PARIS, call("get_weather", {"location": "Tokyo"}, 1)]),
      tool("18", "call_get_weather_0"), tool("25", "call_get_weather_1")])
case("q3_reasoning_final", "qwen3", tools(W),
     [user(Q), asst("", [PARIS]), tool("18"), asst("It is 18 °C.", reasoning="\nuse the result\n")], gen=False)
case("q3_content_and_call", "qwen3", tools(W),
     [user(Q), asst("Let me look.", [PARIS]), tool("18"), asst("18 °C."), user("Thanks")])
case("q3_arg_json", "qwen3", tools(S),
     [user("s"), asst("", [call("search_docs", '{"query": "ü \\"q\\" \\n", "threshold": 1.0, "exact": true, '
                                               '"filters": {"year": 2024, "ids": [1e-7, -0.0, 12345678901234567890]}, '
                                               '"tags": null}')])])
case("q3_unicode_tools", "qwen3", tools(U), [user("Traduis « bonjour » en chinois.")])
case("q3_history_think", "qwen3", tools(W),
     [user("Hi"), asst("<think>\nx\n</think>\n\nHello"), user(Q), asst("", [PARIS]), tool("18")])
case("q3_system_not_first", "qwen3", None, [user("Hi"), system("Mid-conversation note"), user("Go on")])
case("q3_empty_tools_list", "qwen3", "[]", [system("Sys."), user(Q)])
case("q3_float_literals", "qwen3", tools(FLOATS), [user("Set it to 21.5")])
case("q3_nothink_loop", "qwen3", tools(W),
     [user(Q), asst("", [PARIS]), tool("18"), asst("18 °C."), user("Rome?")], think=False)
case("q3_dup_key_tool", "qwen3", tools(DUP), [user("dup")])
case("q3_tool_whitespace_kept", "qwen3", tools(W), [user(Q), asst("", [PARIS]), tool("  18 \n")])
case("q3_middle_turn_with_reasoning", "qwen3", tools(W),
     [user(Q), asst("", [PARIS], reasoning="call it"), tool("18"), asst("Done.")], gen=False)

for c in cases:
    print(json.dumps(c, ensure_ascii=False))
