"""The Go template interpreter (http/ollama/go_template.py) and Ollama's way of running a template on
a conversation (http/ollama/ollama_templates.py), without a server: Go's semantics case by case, the
errors Go raises and the constructs greenroom refuses by name, and templates of Ollama's own
corpus rendered as Ollama renders them. Every expected string here is what Go's text/template
printed for the same template and data (Go 1.19, running Ollama's Execute for the corpus);
docs/ollama.md has the whole corpus's count (bench/ollama_template_corpus.py)."""

import datetime

import pytest

from greenroom.errors import GreenroomError
from greenroom.http.ollama import go_template as go
from greenroom.http.ollama import ollama_templates as ot

# the data of SEMANTICS and GO_ERRORS, as Go's json.Unmarshal gives it (numbers are float64)
DATA = {
    "E": "",
    "S": "héllo",
    "L": ["a", "b", "c"],
    "M": {"z": 1.0, "a": "x", "m": [1.0, 2.5]},
    "T": True,
    "F": False,
    "N": 3.0,
    "Z": 0.0,
    "Nil": None,
    "EL": [],
    "EM": {},
}
SEMANTICS = [
    ("trim markers eat the whitespace beside them", "a  {{- 1 -}}  b", "a1b"),
    ("a comment, trimmed", "a {{- /* c */ -}} b", "ab"),
    ("a comment spanning lines", "a\n{{- /* x\ny */}}\nb", "a\nb"),
    ("no trim without the marker's space", "{{-3}} {{ -3 }}", "-3 -3"),
    (
        "Go's truth",
        "{{ if .E }}y{{ else }}n{{ end }}{{ if .L }}y{{ end }}{{ if .EL }}y{{ else }}n{{ end }}{{ if .EM }}y{{ else }}n{{ end }}{{ if .Z }}y{{ else }}n{{ end }}{{ if .F }}y{{ else }}n{{ end }}{{ if .Nil }}y{{ else }}n{{ end }}{{ if .Nope }}y{{ else }}n{{ end }}{{ if .M }}y{{ end }}",
        "nynnnnnny",
    ),
    ("else if", '{{ if eq .S "a" }}A{{ else if eq .S "héllo" }}H{{ else }}O{{ end }}', "H"),
    (
        "with sets dot",
        "{{ with .M.a }}[{{ . }}]{{ else }}none{{ end }}{{ with .E }}x{{ else }}empty{{ end }}",
        "[x]empty",
    ),
    ("range with index and element", "{{ range $i, $e := .L }}{{ $i }}={{ $e }};{{ end }}", "0=a;1=b;2=c;"),
    ("range over a map: keys in order", "{{ range $k, $v := .M }}{{ $k }}:{{ $v }} {{ end }}", "a:x m:[1 2.5] z:1 "),
    (
        "range else, over nothing",
        "{{ range .EL }}x{{ else }}none{{ end }}{{ range .Nope }}x{{ else }}nothing{{ end }}",
        "nonenothing",
    ),
    (
        "break and continue",
        '{{ range .L }}{{ if eq . "b" }}{{ continue }}{{ end }}{{ if eq . "c" }}{{ break }}{{ end }}{{ . }}{{ end }}',
        "a",
    ),
    ("$ is the data inside range", "{{ range $e := .L }}{{ $e }}{{ $.S }}{{ end }}", "ahéllobhéllochéllo"),
    ("= assigns the outer variable", '{{ $x := "1" }}{{ range .L }}{{ $x = . }}{{ end }}{{ $x }}', "c"),
    (":= in a block shadows it there", '{{ $x := "o" }}{{ if true }}{{ $x := "i" }}{{ $x }}{{ end }}{{ $x }}', "io"),
    ("a variable declared by if's pipeline", "{{ if $v := .S }}{{ $v }}{{ else }}{{ $v }}{{ end }}", "héllo"),
    (
        "and / or return an operand, lazily",
        '{{ and "a" "b" }}|{{ and "" "b" }}|{{ or "" 0 "c" }}|{{ or "" 0 }}|{{ and .E (len .Nope) }}|{{ not .L }}|{{ not .E }}',
        "b||c|0||false|true",
    ),
    (
        "comparisons",
        '{{ eq "b" "a" "b" }} {{ eq .S "x" }} {{ ne "a" "b" }} {{ lt 1 2 }} {{ ge "b" "a" }} {{ eq .Nope "x" }} {{ eq .N 3.0 }}',
        "true false true true true false true",
    ),
    (
        "len counts bytes; slice and index",
        '{{ len .S }} {{ slice .S 0 1 }} {{ slice "abcdef" 1 3 }} {{ index .L 1 }} {{ len (slice .L 1) }} {{ index .M "a" }} {{ index "abc" 1 }} {{ slice .L 1 2 }}',
        "6 h bc b 2 x 98 [b]",
    ),
    (
        "a nil in a pipeline or a variable has no fields",
        "{{ (.Nope).X }} {{ $n := .Nil }}{{ $n.X.Y }}",
        "<no value> <no value>",
    ),
    (
        "a range's variables hold its value in its else part",
        '{{ $i := "outer" }}{{ range $i, $e := .EL }}x{{ else }}{{ len $i }}{{ end }}{{ $i }}',
        "0outer",
    ),
    ("a missing key is <no value>", '{{ .Nope }} {{ index .M "nope" }}', "<no value> <no value>"),
    (
        "printing, as fmt does",
        '{{ printf "%s-%d|%v" "a" 3 .T }} {{ print "a" 1 2 "b" }} {{ println 1 "x" }}|{{ printf "%s" .Nope }}|{{ print .Nope }}',
        "a-3|true a1 2b 1 x\n|%!s(<nil>)|<nil>",
    ),
    (
        "printf's verbs on a value of the wrong type, as fmt writes them",
        '{{ printf "%s|%s|%s|%d|%d|%d|%d" 3 1.5 .T .S 2.5 .F 7 }}',
        "%!s(int=3)|%!s(float64=1.5)|%!s(bool=true)|%!d(string=héllo)|%!d(float64=2.5)|%!d(bool=false)|7",
    ),
    ("a verb missing, a hexadecimal float", '{{ printf "a%" }} {{ 0x1p4 }} {{ 1.5e3 }}', "a%!(NOVERB) 16 1500"),
    (
        "values as %v prints them",
        "{{ .M.m }} {{ .L }} {{ .M }} {{ .N }} {{ 1.5 }} {{ 1e7 }} {{ .T }}",
        "[1 2.5] [a b c] map[a:x m:[1 2.5] z:1] 3 1.5 1e+07 true",
    ),
    (
        "json, as encoding/json writes it",
        '{{ json .M }} {{ json "<a&b>\\n" }} {{ json .L }} {{ json .N }} {{ json .Nil }} {{ json 1.5 }}',
        '{"a":"x","m":[1,2.5],"z":1} "\\u003ca\\u0026b\\u003e\\n" ["a","b","c"] 3 null 1.5',
    ),
    (
        "pipes, chains and literals",
        '{{ "x" | printf "%s%s" "y" }} {{ .S | len }} {{ (index .L 0) }} {{ (.M).a }} {{ \'a\' }} {{ `a\\n` }} {{ "\\u00e9\\t|" }} {{ 0x1F }}',
        "yx 6 a x 97 a\\n é\t| 31",
    ),
]
GO_ERRORS = [  # Go refuses to parse these, or fails executing them
    "{{ if }}",  # :1: missing value for if
    "{{ end }}",  # :1: unexpected {{end}}
    "{{ else }}",  # :1: unexpected {{else}}
    "{{ foo }}",  # :1: function "foo" not defined
    "{{ $x }}",  # :1: undefined variable "$x"
    "{{ break }}",  # :1: {{break}} outside {{range}}
    "{{ .X",  # :1: unclosed action
    "{{ range .L }}",  # :1: unexpected EOF
    "{{ range $i, $e := .L }}{{ end }}{{ $i }}",  # :1: undefined variable "$i"
    "{{ 3 4 }}",  # :1:3: executing "" at <3>: can't give argument to non-function 3
    "{{ .S 1 }}",  # :1:3: executing "" at <.S>: S is not a method but has arguments
    "{{ nil }}",  # :1:3: executing "" at <nil>: nil is not a command
    '{{ eq 1 "1" }}',  # :1:3: executing "" at <eq 1 "1">: error calling eq: incompatible types for comparison
    "{{ eq .L .L }}",  # :1:3: executing "" at <eq .L .L>: error calling eq: non-comparable type [a b c]: []interfa
    "{{ lt true false }}",  # :1:3: executing "" at <lt true false>: error calling lt: invalid type for comparison
    "{{ index .L 5 }}",  # :1:3: executing "" at <index .L 5>: error calling index: index out of range: 5
    "{{ slice .L 2 1 }}",  # :1:3: executing "" at <slice .L 2 1>: error calling slice: invalid slice index: 2 > 1
    "{{ len .N }}",  # :1:3: executing "" at <len .N>: error calling len: len of type float64
    "{{ .Nope.X }}",  # :1:8: executing "" at <.Nope.X>: nil pointer evaluating interface {}.X
    "{{ .S.X }}",  # :1:5: executing "" at <.S.X>: can't evaluate field X in type interface {}
    "{{ range .S }}x{{ end }}",  # :1:9: executing "" at <.S>: range can't iterate over héllo
    "{{ 9223372036854775808 }}",  # :1:3: executing "" at <9223372036854775808>: 9223372036854775808 overflows int
    "{{ index .Nope }}",  # :1:3: executing "" at <index .Nope>: error calling index: index of untyped nil
    "{{ eq }}",  # :1:3: executing "" at <eq>: wrong number of args for eq: want at least 1 got 0
    "{{ and }}",  # :1:3: executing "" at <and>: wrong number of args for and: want at least 1 got 0
    "{{ not 1 2 }}",  # :1:3: executing "" at <not>: wrong number of args for not: want 1 got 2
]


@pytest.mark.parametrize("why,template,expected", SEMANTICS, ids=[c[0] for c in SEMANTICS])
def test_go_semantics(why, template, expected):
    assert go.parse(template, ot.FUNCTIONS).execute(DATA) == expected


@pytest.mark.parametrize("template", GO_ERRORS)
def test_go_errors_are_go_errors_not_refusals(template):
    with pytest.raises(go.TemplateError) as exc:
        go.parse(template, ot.FUNCTIONS).execute(DATA)
    assert exc.value.construct is None and str(exc.value).startswith("line 1: ")


@pytest.mark.parametrize(
    "template,construct",
    [
        ('{{ template "x" }}', "template"),
        ('{{ define "x" }}y{{ end }}', "define"),
        ('{{ block "x" . }}y{{ end }}', "block"),
        ("{{ html .S }}", "html"),
        ("{{ call .S }}", "call"),
        ("{{ urlquery .S }}", "urlquery"),
        ('{{ printf "%x" 3 }}', "printf"),
        ("{{ 1i }}", "a complex number"),
    ],
)
def test_constructs_greenroom_does_not_render_are_refused_by_name(template, construct):
    with pytest.raises(go.TemplateError) as exc:
        go.parse(template).execute(DATA)
    assert exc.value.construct == construct


@pytest.mark.parametrize(
    "value,printed,encoded",
    [
        (1e6, "1e+06", "1000000"),
        (123456.0, "123456", "123456"),
        (1234567.0, "1.234567e+06", "1234567"),
        (1e21, "1e+21", "1e+21"),
        (1e-5, "1e-05", "0.00001"),
        (1e-7, "1e-07", "1e-7"),
        (3.14159e-10, "3.14159e-10", "3.14159e-10"),
        (0.1, "0.1", "0.1"),
        (-0.5, "-0.5", "-0.5"),
        (5e-324, "5e-324", "5e-324"),
    ],
)
def test_floats_print_and_encode_as_go_does(value, printed, encoded):
    """fmt's %v (strconv 'g' at its shortest) and encoding/json's form: every JSON number of a
    tool's call is a float64 in Ollama."""
    assert (go.go_float(value), go.go_float(value, json=True)) == (printed, encoded)


def test_a_template_is_bounded():
    """Nesting, steps and output: what Go leaves unbounded is refused past greenroom's limits."""
    with pytest.raises(go.TemplateError, match="nested deeper than 100"):
        go.parse("{{ if 1 }}" * 101 + "{{ end }}" * 101)
    cubed = go.parse("{{ range .L }}{{ range $.L }}{{ range $.L }}{{ end }}{{ end }}{{ end }}")
    with pytest.raises(go.TemplateError, match="passes 1000000 steps"):
        cubed.execute({"L": list(range(200))})
    with pytest.raises(go.TemplateError, match="output passes"):
        go.parse("{{ range .L }}{{ $.S }}{{ end }}").execute({"L": list(range(100)), "S": "x" * 200_000})


def test_a_struct_prints_only_by_its_string_method():
    point = go.Struct("api.Point", {"X": 1}, (("X", "x", False),))
    with pytest.raises(go.TemplateError) as exc:
        go.parse("{{ . }}").execute(point)
    assert exc.value.construct == "printing a struct" and "api.Point" in str(exc.value)
    shown = go.Struct("api.Point", {"X": 1}, (("X", "x", False),), string=go.go_json)
    assert go.parse("{{ . }} {{ .X }} {{ .String }}").execute(shown) == '{"x":1} 1 {"x":1}'
    with pytest.raises(go.TemplateError, match="can't evaluate field Y in type api.Point"):
        go.parse("{{ .Y }}").execute(shown)


# Templates from ollama/ollama's template/ folder (MIT License, Copyright (c) Ollama), each at the
# commit named; the outputs are what Go's text/template prints running Ollama's Execute on
# CHAT, TOOLS + CALL, and CHAT with think: false (checked with Go 1.19).
OLLAMA_TEMPLATES = {
    "chatml@9fbfa742": (
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n",
        "<|im_start|>system\nYou answer in one word.<|im_end|>\n<|im_start|>user\nWhat colour is the sky?<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnd grass?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nTime in Paris?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n12:00<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou answer in one word.<|im_end|>\n<|im_start|>user\nWhat colour is the sky?<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnd grass?<|im_end|>\n<|im_start|>assistant\n",
    ),
    "llama3-instruct@888b6fbb": (
        "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>\n{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|start_header_id|>system<|end_header_id|>\n\nYou answer in one word.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat colour is the sky?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nBlue.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd grass?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|start_header_id|>user<|end_header_id|>\n\nTime in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|><|start_header_id|>tool<|end_header_id|>\n\n12:00<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|start_header_id|>system<|end_header_id|>\n\nYou answer in one word.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat colour is the sky?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nBlue.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd grass?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "alpaca@040a8e85": (
        '{{- $system := "" }}\n{{- range .Messages }}\n{{- if eq .Role "system" }}\n{{- if not $system }}{{ $system = .Content }}\n{{- else }}{{ $system = printf "%s\\n\\n%s" $system .Content }}\n{{- end }}\n{{- else if eq .Role "user" }}\n{{- if $system }}{{ $system }}\n\n{{ $system = "" }}\n{{- end }}### Instruction:\n{{ .Content }}\n\n{{ else if eq .Role "assistant" }}### Response:\n{{ .Content }}\n\n{{ end }}\n{{- end }}### Response:\n',
        "You answer in one word.\n\n### Instruction:\nWhat colour is the sky?\n\n### Response:\nBlue.\n\n### Instruction:\nAnd grass?\n\n### Response:\n",
        "### Instruction:\nTime in Paris?\n\n### Response:\n\n\n### Response:\n",
        "You answer in one word.\n\n### Instruction:\nWhat colour is the sky?\n\n### Response:\nBlue.\n\n### Instruction:\nAnd grass?\n\n### Response:\n",
    ),
    "gemma3-instruct@a10ddf25": (
        '{{- range $i, $_ := .Messages }}\n{{- $last := eq (len (slice $.Messages $i)) 1 }}\n{{- if eq .Role "user" }}<start_of_turn>user\n{{- if and (eq $i 1) $.System }}\n{{ $.System }}\n{{ end }}\n{{ .Content }}<end_of_turn>\n{{ else if eq .Role "assistant" }}<start_of_turn>model\n{{ .Content }}<end_of_turn>\n{{ end }}\n{{- if $last }}<start_of_turn>model\n{{ end }}\n{{- end }}\n',
        "<start_of_turn>user\nYou answer in one word.\n\nWhat colour is the sky?<end_of_turn>\n<start_of_turn>model\nBlue.<end_of_turn>\n<start_of_turn>user\nAnd grass?<end_of_turn>\n<start_of_turn>model\n\n",
        "<start_of_turn>user\nTime in Paris?<end_of_turn>\n<start_of_turn>model\n<end_of_turn>\n<start_of_turn>model\n\n",
        "<start_of_turn>user\nYou answer in one word.\n\nWhat colour is the sky?<end_of_turn>\n<start_of_turn>model\nBlue.<end_of_turn>\n<start_of_turn>user\nAnd grass?<end_of_turn>\n<start_of_turn>model\n\n",
    ),
    "mistral-instruct@75d1b796": (
        '[INST] {{ range $index, $_ := .Messages }}\n{{- if eq .Role "system" }}{{ .Content }}\n\n{{ else if eq .Role "user" }}{{ .Content }}[/INST]\n{{- else if eq .Role "assistant" }} {{ .Content }}</s>[INST] {{ end }}\n{{- end }}',
        "[INST] You answer in one word.\n\nWhat colour is the sky?[/INST] Blue.</s>[INST] And grass?[/INST]",
        "[INST] Time in Paris?[/INST] </s>[INST] ",
        "[INST] You answer in one word.\n\nWhat colour is the sky?[/INST] Blue.</s>[INST] And grass?[/INST]",
    ),
    "command-r@f7cc50a7": (
        '{{- if or .Tools .System }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>\n{{- if .Tools }}# Safety Preamble\nThe instructions in this section override those in the task description and style guide sections. Don\'t answer questions that are harmful or immoral.\n\n# System Preamble\n## Basic Rules\nYou are a powerful conversational AI trained by Cohere to help people. You are augmented by a number of tools, and your job is to use and consume the output of these tools to best help the user. You will see a conversation history between yourself and a user, ending with an utterance from the user. You will then see a specific instruction instructing you what kind of response to generate. When you answer the user\'s requests, you cite your sources in your answers, according to those instructions.\n\n{{ if .System }}# User Preamble\n{{ .System }}\n{{- end }}\n\n## Available Tools\nHere is a list of tools that you have available to you:\n{{- range .Tools }}\n\n```python\ndef {{ .Function.Name }}(\n{{- range $name, $property := .Function.Parameters.Properties }}{{ $name }}: {{ $property.Type }}, {{ end }}) -> List[Dict]:\n    \'\'\'{{ .Function.Description }}\n\n{{- if .Function.Parameters.Properties }}\n\n    Args:\n{{- range $name, $property := .Function.Parameters.Properties }}\n        {{ $name }} ({{ $property.Type }}): {{ $property.Description }}\n{{- end }}\n{{- end }}\n    \'\'\'\n    pass\n```\n{{- end }}\n{{- else if .System }}{{ .System }}\n{{- end }}<|END_OF_TURN_TOKEN|>\n{{- end }}\n{{- range .Messages }}\n{{- if eq .Role "system" }}\n{{- continue }}\n{{- end }}<|START_OF_TURN_TOKEN|>\n{{- if eq .Role "user" }}<|USER_TOKEN|>{{ .Content }}\n{{- if $.Tools }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write \'Action:\' followed by a json-formatted list of actions that you want to perform in order to produce a good response to the user\'s last input. You can use any of the supplied tools any number of times, but you should aim to execute the minimum number of necessary actions for the input. You should use the `directly-answer` tool if calling the other tools is unnecessary. The list of actions you want to call should be formatted as a list of json objects, for example:\n```json\n[\n    {\n        "tool_name": title of the tool in the specification,\n        "parameters": a dict of parameters to input into the tool as they are defined in the specs, or {} if it takes no parameters\n    }\n]```\n{{- end }}\n{{- else if eq .Role "assistant" }}<|CHATBOT_TOKEN|>\n{{- if .Content }}{{ .Content }}\n{{- else if .ToolCalls }}\nAction: ```json\n[\n{{- range .ToolCalls }}\n    {\n        "tool_name": "{{ .Function.Name }}",\n        "parameters": {{ .Function.Arguments }}\n    }\n{{- end }}\n]```\n{{- end }}\n{{- else if eq .Role "tool" }}<|SYSTEM_TOKEN|><results>\nconsole_output: {{ .Content }}\n</results>\n{{- end }}<|END_OF_TURN_TOKEN|>\n{{- end }}<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n',
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You answer in one word.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What colour is the sky?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Blue.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>And grass?<|END_OF_TURN_TOKEN|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n",
        '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># Safety Preamble\nThe instructions in this section override those in the task description and style guide sections. Don\'t answer questions that are harmful or immoral.\n\n# System Preamble\n## Basic Rules\nYou are a powerful conversational AI trained by Cohere to help people. You are augmented by a number of tools, and your job is to use and consume the output of these tools to best help the user. You will see a conversation history between yourself and a user, ending with an utterance from the user. You will then see a specific instruction instructing you what kind of response to generate. When you answer the user\'s requests, you cite your sources in your answers, according to those instructions.\n\n\n\n## Available Tools\nHere is a list of tools that you have available to you:\n\n```python\ndef get_time(timezone: string, ) -> List[Dict]:\n    \'\'\'The time in a timezone\n\n    Args:\n        timezone (string): An IANA name\n    \'\'\'\n    pass\n```<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Time in Paris?<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write \'Action:\' followed by a json-formatted list of actions that you want to perform in order to produce a good response to the user\'s last input. You can use any of the supplied tools any number of times, but you should aim to execute the minimum number of necessary actions for the input. You should use the `directly-answer` tool if calling the other tools is unnecessary. The list of actions you want to call should be formatted as a list of json objects, for example:\n```json\n[\n    {\n        "tool_name": title of the tool in the specification,\n        "parameters": a dict of parameters to input into the tool as they are defined in the specs, or {} if it takes no parameters\n    }\n]```<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\nAction: ```json\n[\n    {\n        "tool_name": "get_time",\n        "parameters": {"timezone":"Europe/Paris"}\n    }\n]```<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><results>\nconsole_output: 12:00\n</results><|END_OF_TURN_TOKEN|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n',
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You answer in one word.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What colour is the sky?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Blue.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>And grass?<|END_OF_TURN_TOKEN|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n",
    ),
    "deepseek@2d407e9d": (
        '{{- if .System }}{{ .System }}{{ end }}\n{{- if .Tools }}\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{{- range $i, $_ := .Tools }}\n{{ .Function }}\n{{- end }}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.\n{{- end }}\n{{- range $i, $_ := .Messages }}\n  {{- $last := eq (len (slice $.Messages $i)) 1 }}\n  {{- if eq .Role "user" -}}\n    <｜User｜>{{ .Content }}\n  {{- else if eq .Role "assistant" -}}\n    <｜Assistant｜>\n    {{- if .ToolCalls -}}\n      {{ "\\n" }}<｜tool▁calls▁begin｜>{{ "\\n" }}\n      {{- range $i, $_ := .ToolCalls -}}\n        <｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ .Function.Name }}\n```json\n{{ .Function.Arguments }}\n```<｜tool▁call▁end｜>{{ "\\n" }}\n      {{- end -}}\n      <｜tool▁calls▁end｜><｜end▁of▁sentence｜>\n    {{- end }}\n    {{- if and $.IsThinkSet (and $last .Thinking) -}}\n      <think>\n        {{ .Thinking }}\n      </think>\n    {{- end }}{{ .Content }}{{- if not $last }}<｜end▁of▁sentence｜>{{- end }}\n  {{- else if eq .Role "tool" -}}\n    {{ "\\n" }}<｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>{{ "\\n" }}\n  {{- end }}\n  {{- if and $last (ne .Role "assistant") -}}\n    <｜Assistant｜>\n    {{- if and $.IsThinkSet (not $.Think) -}}\n      <think> </think>\n    {{ end }}\n  {{- end -}}\n{{- end -}}\n',
        "You answer in one word.<｜User｜>What colour is the sky?<｜Assistant｜>Blue.<｜end▁of▁sentence｜><｜User｜>And grass?<｜Assistant｜>",
        '\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"name":"get_time","description":"The time in a timezone","parameters":{"type":"object","required":["timezone"],"properties":{"timezone":{"type":"string","description":"An IANA name","enum":["UTC","Europe/Paris"]}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<｜User｜>Time in Paris?<｜Assistant｜>\n<｜tool▁calls▁begin｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{"timezone":"Europe/Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜end▁of▁sentence｜>\n<｜tool▁output▁begin｜>12:00<｜tool▁output▁end｜>\n<｜Assistant｜>',
        "You answer in one word.<｜User｜>What colour is the sky?<｜Assistant｜>Blue.<｜end▁of▁sentence｜><｜User｜>And grass?<｜Assistant｜><think> </think>\n    ",
    ),
    "granite-instruct@12f540f0": (
        "{{ if .System }}\nSystem:\n{{ .System }}\n\n{{ end }}{{ if .Prompt }}Question:\n{{ .Prompt }}\n\n{{ end }}Answer:\n{{ .Response }}",
        "\nSystem:\nYou answer in one word.\n\nQuestion:\nWhat colour is the sky?\n\nAnswer:\nBlue.Question:\nAnd grass?\n\nAnswer:\n",
        "Question:\nTime in Paris?\n\nAnswer:\n",
        "\nSystem:\nYou answer in one word.\n\nQuestion:\nWhat colour is the sky?\n\nAnswer:\nBlue.Question:\nAnd grass?\n\nAnswer:\n",
    ),
    "phi-3@4587734e": (
        "{{ if .System }}<|system|>\n{{ .System }}<|end|>\n{{ end }}{{ if .Prompt }}<|user|>\n{{ .Prompt }}<|end|>\n{{ end }}<|assistant|>\n{{ .Response }}<|end|>",
        "<|system|>\nYou answer in one word.<|end|>\n<|user|>\nWhat colour is the sky?<|end|>\n<|assistant|>\nBlue.<|end|><|user|>\nAnd grass?<|end|>\n<|assistant|>\n",
        "<|user|>\nTime in Paris?<|end|>\n<|assistant|>\n",
        "<|system|>\nYou answer in one word.<|end|>\n<|user|>\nWhat colour is the sky?<|end|>\n<|assistant|>\nBlue.<|end|><|user|>\nAnd grass?<|end|>\n<|assistant|>\n",
    ),
}

CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "And grass?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a timezone",
            "parameters": {
                "type": "object",
                "required": ["timezone"],
                "properties": {
                    "timezone": {"type": "string", "description": "An IANA name", "enum": ["UTC", "Europe/Paris"]}
                },
            },
        },
    }
]
CALL = [
    {"role": "user", "content": "Time in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}}],
    },
    {"role": "tool", "content": "12:00"},
]


@pytest.mark.parametrize("name", list(OLLAMA_TEMPLATES))
def test_ollama_templates_render_as_ollama_renders_them(name):
    template, chat, tools, think_off = OLLAMA_TEMPLATES[name]
    assert ot.execute(template, CHAT) == chat
    assert ot.execute(template, CALL, TOOLS) == tools
    assert ot.execute(template, CHAT, think=False) == think_off


def test_messages_are_collated_as_ollama_collates_them():
    """Every system message is .System, joined by a blank line; consecutive messages of one role
    are one (tool results are not merged); a developer message counts as a system message."""
    messages = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "x"},
        {"role": "user", "content": [{"type": "text", "text": "y"}]},
        {"role": "tool", "content": "t1"},
        {"role": "tool", "content": "t2"},
        {"role": "developer", "content": "d"},
    ]
    template = "{{ .System }}|{{ range .Messages }}{{ .Role }}:{{ .Content }};{{ end }}"
    assert ot.execute(template, messages) == "a\n\nb\n\nd|system:a\n\nb;user:x\n\ny;tool:t1;tool:t2;system:d;"


def test_a_legacy_template_gets_its_response_appended_and_is_cut_after_it():
    """Without .Messages or .Response Ollama appends {{ .Response }}; each exchange renders the
    whole template, the last one only up to its .Response."""
    assert ot.execute("[{{ .Prompt }}]", CHAT[1:]) == "[What colour is the sky?]Blue.[And grass?]"
    assert (
        ot.execute("<{{ .Prompt }}>{{ .Response }}</s>", CHAT[1:]) == "<What colour is the sky?>Blue.</s><And grass?>"
    )


def test_tools_and_methods_as_ollama_gives_them():
    template = (
        "{{ range .Tools }}{{ .Function.Name }}({{ range $k, $v := .Function.Parameters.Properties }}"
        "{{ $k }}: {{ $v.ToTypeScriptType }} {{ toTypeScriptType $v }}{{ end }}) {{ json .Function.Parameters.Required }}"
        "{{ end }}|{{ range .Messages }}{{ range .ToolCalls }}{{ .Function.Arguments }}{{ end }}{{ end }}|{{ currentDate }}"
    )
    today = datetime.date.today().isoformat()
    assert (
        ot.execute(template, CALL, TOOLS)
        == f'get_time(timezone: string string) ["timezone"]|{{"timezone":"Europe/Paris"}}|{today}'
    )
    no_tools = "{{ .Tools }} {{ len .Tools }} {{ if .Tools }}y{{ end }}{{ range .Messages }}{{ end }}"
    assert ot.execute(no_tools, CHAT) == "null 0 "  # Ollama's nil api.Tools


def test_create_check_keeps_refuses_or_drops_a_template():
    assert (
        ot.check("{{ range .Messages }}{{ .Content }}{{ end }}", own="x")
        == "{{ range .Messages }}{{ .Content }}{{ end }}"
    )
    own = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert ot.check(own, own) == ""  # the base's own template, as /api/show prints it: nothing to keep
    assert ot.check(f"\n{own}\n", own) == ""
    refusals = [
        ("{{ .Foo }}", "field_not_honoured", ".Foo is none of the values Ollama gives"),
        ('{{ template "x" }}', "field_not_honoured", "{{template}} is not rendered"),
        ("{{ if }}", "invalid_parameter", "missing command"),
        (own, "invalid_parameter", "unexpected '['"),  # another model's Jinja
        (
            "{{ range .Messages }}{{ .Foo }}{{ end }}",
            "invalid_parameter",
            "can't evaluate field Foo in type api.Message",
        ),
    ]
    for template, code, words in refusals:
        with pytest.raises(GreenroomError) as exc:
            ot.check(template, own="x")
        assert (exc.value.code, exc.value.param) == (code, "template") and words in exc.value.message, exc.value
