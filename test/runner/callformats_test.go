package e2e

// Templates that teach the coding models' call syntaxes, written for these tests (the
// real ones are not in the module cache): with the Llama 3 vocabulary their marks are
// plain text, so the runner's format detection, the forced-call grammar and the
// output parser are exercised on real generation.

// deepseekTemplate writes calls as DeepSeek V3.1 does.
const deepseekTemplate = `{% if tools %}Functions: {% for t in tools %}{{ t | tojson }}{% endfor %}
{% endif %}{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}` +
	`{% elif m.role == 'assistant' %}<｜Assistant｜>{% if m.tool_calls %}<｜tool▁calls▁begin｜>{% for c in m.tool_calls %}` +
	`<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments | tojson }}<｜tool▁call▁end｜>{% endfor %}` +
	`<｜tool▁calls▁end｜>{% else %}{{ m.content }}{% endif %}<｜end▁of▁sentence｜>` +
	`{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{% endif %}{% endfor %}` +
	`{% if add_generation_prompt %}<｜Assistant｜>{% endif %}`

// kimiTemplate writes calls as Kimi K2 does.
const kimiTemplate = `{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}` +
	`{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{% if m.tool_calls %}<|tool_calls_section_begin|>` +
	`{% for c in m.tool_calls %}<|tool_call_begin|>functions.{{ c.function.name }}:{{ loop.index0 }}<|tool_call_argument_begin|>` +
	`{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>{% else %}{{ m.content }}{% endif %}` +
	`<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}`

// qwen3CoderTemplate writes calls as Qwen3-Coder does.
const qwen3CoderTemplate = `{% if tools %}<|im_start|>system
# Tools
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>
<function={{ c.function.name }}>
{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>
{{ v }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`
