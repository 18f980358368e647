// Package chat turns OpenAI chat requests into prompts with the model's own Jinja chat
// template and turns the model's output back into OpenAI messages: content, reasoning
// content and tool calls, whole or streamed. It is pure Go; the runner calls it
// around the engine.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/jinja"
)

// Template is a model's chat template, parsed once and rendered per request.
type Template struct {
	tmpl     *jinja.Template
	bos, eos string
	// Format is how the model writes tool calls, detected from the template.
	Format Format
	// Tools reports whether the template renders a tools list.
	Tools bool
	// Thinking reports whether the template knows <think> reasoning blocks.
	Thinking bool
	// stringArgs: the template joins a call's arguments to strings (DeepSeek's do),
	// so they are given as the JSON string, not as an object.
	stringArgs bool
}

// NewTemplate parses a GGUF's tokenizer.chat_template. bos and eos are the texts of
// the model's BOS and EOS tokens (bos_token and eos_token in the template).
func NewTemplate(src, bos, eos string) (*Template, error) {
	t, err := jinja.Parse(src)
	if err != nil {
		return nil, err
	}
	tm := &Template{
		tmpl: t, bos: bos, eos: eos,
		Format:   DetectFormat(src),
		Tools:    strings.Contains(src, "tools"),
		Thinking: strings.Contains(src, "<think>"),
	}
	// What the template renders for a call is the better signal; the marks in its
	// source decide where it renders none (or fails on the probe).
	if tm.Tools {
		tm.probe()
	}
	return tm, nil
}

// Input is what a prompt is rendered from.
type Input struct {
	Messages []runnerapi.Message
	Tools    []runnerapi.Tool
	// Kwargs are chat_template_kwargs: extra top-level template variables.
	Kwargs map[string]json.RawMessage
	// ReasoningEffort reaches templates that read it (gpt-oss).
	ReasoningEffort string
	// AddGenerationPrompt opens the assistant's turn.
	AddGenerationPrompt bool
}

// InputOf is the input of a chat request.
func InputOf(req *runnerapi.ChatRequest) Input {
	in := Input{Messages: req.Messages, Kwargs: req.ChatTemplateKwargs, ReasoningEffort: req.ReasoningEffort,
		AddGenerationPrompt: true}
	if req.ToolChoice == nil || req.ToolChoice.Mode != "none" {
		in.Tools = req.Tools
	}
	return in
}

// Render renders the prompt. It strips a leading BOS text when stripBOS is set (the
// tokenizer adds BOS itself). Errors are *runnerapi.Error: a conversation the template
// refuses (raise_exception) or cannot render is the client's 400.
func (t *Template) Render(in Input, stripBOS bool) (string, *runnerapi.Error) {
	if len(in.Tools) > 0 && !t.Tools {
		return "", runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, "tools",
			"this model's chat template does not render tools, so it cannot call them")
	}
	vars, e := t.vars(in)
	if e != nil {
		return "", e
	}
	out, err := t.tmpl.Render(vars)
	if err != nil {
		var raised *jinja.RaisedError
		if errors.As(err, &raised) {
			return "", runnerapi.InvalidRequest(runnerapi.CodeTemplateError, "messages",
				"the model's chat template refused the conversation: %s", raised.Message)
		}
		return "", runnerapi.InvalidRequest(runnerapi.CodeTemplateError, "messages",
			"the model's chat template failed to render the conversation: %v", err)
	}
	if stripBOS && t.bos != "" {
		out = strings.TrimPrefix(out, t.bos)
	}
	return out, nil
}

func (t *Template) vars(in Input) (map[string]any, *runnerapi.Error) {
	msgs := &jinja.List{}
	for i, m := range in.Messages {
		d, e := messageValue(m, i, t.stringArgs)
		if e != nil {
			return nil, e
		}
		msgs.Items = append(msgs.Items, d)
	}
	vars := map[string]any{
		"messages":              msgs,
		"add_generation_prompt": in.AddGenerationPrompt,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
	}
	if len(in.Tools) > 0 {
		tools := &jinja.List{}
		for i, tool := range in.Tools {
			v, err := toolValue(tool)
			if err != nil {
				return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, fmt.Sprintf("tools[%d].function.parameters", i),
					"parameters is not valid JSON: %v", err)
			}
			tools.Items = append(tools.Items, v)
		}
		vars["tools"] = tools
	}
	if in.ReasoningEffort != "" {
		vars["reasoning_effort"] = in.ReasoningEffort
	}
	for k, raw := range in.Kwargs {
		v, err := jinja.FromJSON(raw)
		if err != nil {
			return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "chat_template_kwargs."+k, "invalid JSON: %v", err)
		}
		vars[k] = v
	}
	return vars, nil
}

// messageValue is a message as templates expect it: content a string, tool call
// arguments an object (templates print them with tojson), or with stringArgs the
// JSON string the client sent.
func messageValue(m runnerapi.Message, i int, stringArgs bool) (*jinja.Dict, *runnerapi.Error) {
	d := jinja.NewDict()
	role := m.Role
	d.Set("role", role)
	d.Set("content", string(m.Content))
	if m.Name != "" {
		d.Set("name", m.Name)
	}
	if m.ReasoningContent != "" {
		d.Set("reasoning_content", m.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 {
		calls := &jinja.List{}
		for j, c := range m.ToolCalls {
			fn := jinja.NewDict()
			fn.Set("name", c.Function.Name)
			args, err := jinja.FromJSON([]byte(c.Function.Arguments))
			if c.Function.Arguments == "" {
				args, err = jinja.NewDict(), nil
			}
			if err != nil {
				return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue,
					fmt.Sprintf("messages[%d].tool_calls[%d].function.arguments", i, j),
					"arguments must be a JSON string holding an object: %v", err)
			}
			if s := strings.TrimSpace(c.Function.Arguments); stringArgs && s != "" {
				fn.Set("arguments", s)
			} else if stringArgs {
				fn.Set("arguments", "{}")
			} else {
				fn.Set("arguments", args)
			}
			call := jinja.NewDict()
			if c.ID != "" {
				call.Set("id", c.ID)
			}
			call.Set("type", "function")
			call.Set("function", fn)
			calls.Items = append(calls.Items, call)
		}
		d.Set("tool_calls", calls)
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", m.ToolCallID)
	}
	return d, nil
}

func toolValue(t runnerapi.Tool) (*jinja.Dict, error) {
	fn := jinja.NewDict()
	fn.Set("name", t.Function.Name)
	if t.Function.Description != "" {
		fn.Set("description", t.Function.Description)
	}
	if len(t.Function.Parameters) > 0 && string(t.Function.Parameters) != "null" {
		params, err := jinja.FromJSON(t.Function.Parameters)
		if err != nil {
			return nil, err
		}
		fn.Set("parameters", params)
	}
	d := jinja.NewDict()
	d.Set("type", "function")
	d.Set("function", fn)
	return d, nil
}
