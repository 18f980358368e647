package corpus

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// toolUse is one tool and a request that needs it: the call's arguments come from
// the question, the final answer from the tool's result.
type toolUse struct {
	tool     runnerapi.Tool
	question string
	args     map[string]any
	// argOrder is the order the arguments are written in (the schema's).
	argOrder []string
	result   string
	answer   string
}

// family makes a tool of one kind, named and described one of several ways, and a
// use of it.
type family func(r *rand.Rand) toolUse

// param is one parameter of a schema.
type param struct{ name, typ, desc string }

func makeTool(r *rand.Rand, name, desc string, params []param, required int) runnerapi.Tool {
	props := map[string]any{}
	var order, req []string
	for i, p := range params {
		s := map[string]any{"type": p.typ}
		if chance(r, 0.7) {
			s["description"] = p.desc
		}
		props[p.name] = s
		order = append(order, p.name)
		if i < required {
			req = append(req, p.name)
		}
	}
	schema := orderedSchema(order, props, req, chance(r, 0.3))
	if chance(r, 0.15) {
		desc = "" // some tools have no description
	}
	return runnerapi.Tool{Type: "function", Function: runnerapi.Function{Name: name, Description: desc, Parameters: schema}}
}

// orderedSchema writes an object schema with its properties in order.
func orderedSchema(order []string, props map[string]any, req []string, closed bool) json.RawMessage {
	var b strings.Builder
	b.WriteString(`{"type": "object", "properties": {`)
	for i, name := range order {
		if i > 0 {
			b.WriteString(", ")
		}
		k, _ := json.Marshal(name)
		v, _ := json.Marshal(props[name])
		fmt.Fprintf(&b, "%s: %s", k, v)
	}
	b.WriteString("}")
	if len(req) > 0 {
		r, _ := json.Marshal(req)
		fmt.Fprintf(&b, `, "required": %s`, r)
	}
	if closed {
		b.WriteString(`, "additionalProperties": false`)
	}
	b.WriteString("}")
	return json.RawMessage(b.String())
}

func weather(r *rand.Rand) toolUse {
	name := pick(r, []string{"get_weather", "get_weather", "get_current_weather", "weather", "lookup_weather", "fetch_weather"})
	p := pick(r, []string{"city", "city", "location", "place"})
	city := pick(r, cities)
	temp, cond := r.IntN(38)-6, pick(r, conditions)
	t := makeTool(r, name, pick(r, []string{"Get the current weather for a city.", "Returns the weather in a location.",
		"Look up the weather."}), []param{{p, "string", "The city name"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"What's the weather in %s?", "Weather in %s?", "What is the weather like in %s today?",
		"Is it raining in %s right now?", "How warm is it in %s?", "Tell me the weather for %s, please.",
		"Check the weather in %s.", "weather %s", "Do I need an umbrella in %s today?"}), city)
	// Tools name their fields differently, and not all say the unit: a model that
	// saw one shape answered another's {"temperature": 23, "condition": "sunny"}
	// with "It is 23."
	unit := ""
	if chance(r, 0.5) {
		unit = `, "unit": "celsius"`
	}
	res := fmt.Sprintf(`{"%s": "%s", "%s": %d%s, "%s": "%s"}`, p, city, pick(r, []string{"temperature", "temperature", "temp"}),
		temp, unit, pick(r, []string{"condition", "condition", "conditions"}), cond)
	ans := fmt.Sprintf(pick(r, []string{"It is %[2]d°C and %[3]s in %[1]s right now.", "The weather in %[1]s is %[3]s, %[2]d°C.",
		"In %[1]s it is currently %[3]s with a temperature of %[2]d°C."}), city, temp, cond)
	switch r.IntN(4) {
	case 0:
		res = fmt.Sprintf("%d°C and %s", temp, cond)
		ans = fmt.Sprintf(pick(r, []string{"It is %s in %s right now.", "Right now it is %s in %s."}), res, city)
	case 1: // a tool that answers in a sentence (as SDK examples do) is quoted
		res = fmt.Sprintf(pick(r, []string{"The weather in %[1]s is %[3]s and %[2]d degrees.", "%[1]s: %[3]s, %[2]d°C"}), city, temp, cond)
		ans = fmt.Sprintf(pick(r, []string{"Here is the weather: %s", "The tool says: %s"}), res)
	}
	return toolUse{tool: t, question: q, args: map[string]any{p: city}, argOrder: []string{p}, result: res, answer: ans}
}

func clock(r *rand.Rand) toolUse {
	name := pick(r, []string{"get_time", "get_current_time", "current_time", "time_in"})
	p := pick(r, []string{"city", "location", "timezone"})
	city := pick(r, cities)
	hh, mm := r.IntN(24), r.IntN(60)
	t := makeTool(r, name, "Get the current local time in a city.", []param{{p, "string", "City or time zone"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"What time is it in %s?", "Current time in %s?", "What's the local time in %s right now?"}), city)
	res := fmt.Sprintf(`{"time": "%02d:%02d"}`, hh, mm)
	return toolUse{tool: t, question: q, args: map[string]any{p: city}, argOrder: []string{p}, result: res,
		answer: fmt.Sprintf("It is %02d:%02d in %s.", hh, mm, city)}
}

func readFile(r *rand.Rand) toolUse { return readFileOf(r, 30, 60) }

// readFileOf is a read of a file of least+[0, span) characters, quoted whole in the
// answer.
func readFileOf(r *rand.Rand, least, span int) toolUse {
	name := pick(r, []string{"read_file", "read_file", "read", "open_file", "cat"})
	p := pick(r, []string{"path", "path", "file_path", "filename"})
	path := filePath(r)
	t := makeTool(r, name, "Read a file and return its contents.", []param{{p, "string", "Path of the file"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"Show me what's in %s.", "Read %s.", "What does %s say?", "Open %s and tell me what it contains.",
		"Can you read the file %s?", "cat %s"}), path)
	line := filler(r, least+r.IntN(span))
	return toolUse{tool: t, question: q, args: map[string]any{p: path}, argOrder: []string{p}, result: line,
		answer: fmt.Sprintf(pick(r, []string{"The file %s says: %s", "%s contains: %s"}), path, line)}
}

func listFiles(r *rand.Rand) toolUse {
	name := pick(r, []string{"list_files", "list_files", "list_directory", "ls", "list_dir"})
	p := pick(r, []string{"path", "directory", "dir"})
	dir := pick(r, dirs)
	files := fileList(r, 2+r.IntN(5))
	t := makeTool(r, name, "List the files in a directory.", []param{{p, "string", "The directory"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"List the files in %s.", "What files are in %s?", "Show me the files in %s.",
		"list files in %s", "Which files does %s contain?"}), dir)
	return toolUse{tool: t, question: q, args: map[string]any{p: dir}, argOrder: []string{p}, result: strings.Join(files, "\n"),
		answer: fmt.Sprintf(pick(r, []string{"%s contains %s.", "The files in %s are %s."}), dir, and(files))}
}

func search(r *rand.Rand) toolUse { return searchOf(r, 40, 60) }

// searchOf is a search whose one result's snippet of least+[0, span) characters is
// quoted whole in the answer.
func searchOf(r *rand.Rand, least, span int) toolUse {
	name := pick(r, []string{"search_web", "web_search", "search", "lookup"})
	topic := pick(r, topics)
	t := makeTool(r, name, "Search the web.", []param{{"query", "string", "The search query"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"Search the web for %s.", "Look up %s.", "Find something about %s.", "Search for %s"}), topic)
	snippet := filler(r, least+r.IntN(span))
	return toolUse{tool: t, question: q, args: map[string]any{"query": topic}, argOrder: []string{"query"},
		result: fmt.Sprintf(`{"results": [{"title": "About %s", "snippet": %q}]}`, topic, snippet),
		answer: fmt.Sprintf("I found a page about %s. It says: %s", topic, snippet)}
}

func calculate(r *rand.Rand) toolUse {
	name := pick(r, []string{"calculate", "calculator", "evaluate", "math"})
	op := pick(r, opWords)
	a, b := r.IntN(900)+10, r.IntN(90)+2
	expr := fmt.Sprintf("%d %s %d", a, op.sym, b)
	v := op.f(a, b)
	t := makeTool(r, name, "Evaluate an arithmetic expression.", []param{{"expression", "string", "For example 2 * 3"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"Use the calculator: what is %s?", "Calculate %s.", "What is %s? Use the tool."}), expr)
	return toolUse{tool: t, question: q, args: map[string]any{"expression": expr}, argOrder: []string{"expression"},
		result: fmt.Sprint(v), answer: fmt.Sprintf("%s is %d.", expr, v)}
}

func convert(r *rand.Rand) toolUse {
	name := pick(r, []string{"convert_currency", "currency_convert", "exchange"})
	amount := 5 * (1 + r.IntN(60))
	from, to := pick(r, currencies), pick(r, currencies)
	for to == from {
		to = pick(r, currencies)
	}
	rate := 0.5 + r.Float64()
	got := fmt.Sprintf("%.2f", float64(amount)*rate)
	t := makeTool(r, name, "Convert an amount between currencies.",
		[]param{{"amount", "number", "The amount"}, {"from", "string", "Currency code"}, {"to", "string", "Currency code"}}, 3)
	q := fmt.Sprintf(pick(r, []string{"How much is %d %s in %s?", "Convert %d %s to %s.", "%d %s to %s?"}), amount, from, to)
	return toolUse{tool: t, question: q, args: map[string]any{"amount": amount, "from": from, "to": to},
		argOrder: []string{"amount", "from", "to"}, result: fmt.Sprintf(`{"result": %s, "currency": "%s"}`, got, to),
		answer: fmt.Sprintf("%d %s is %s %s.", amount, from, got, to)}
}

func addTask(r *rand.Rand) toolUse {
	name := pick(r, []string{"add_task", "create_todo", "add_todo", "create_task"})
	p := pick(r, []string{"title", "task", "text"})
	task := pick(r, tasks)
	t := makeTool(r, name, "Add an item to the to-do list.", []param{{p, "string", "What to do"}}, 1)
	q := fmt.Sprintf(pick(r, []string{"Add a task to %s.", "Remind me to %s.", "Put \"%s\" on my to-do list."}), task)
	id := 1 + r.IntN(99)
	return toolUse{tool: t, question: q, args: map[string]any{p: task}, argOrder: []string{p},
		result: fmt.Sprintf(`{"id": %d, "status": "created"}`, id), answer: fmt.Sprintf("I added \"%s\" to your list as task %d.", task, id)}
}

func email(r *rand.Rand) toolUse {
	name := pick(r, []string{"send_email", "email", "send_mail"})
	who := pick(r, people)
	to := strings.ToLower(who) + "@example.com"
	subject := pick(r, []string{"Meeting moved", "Lunch tomorrow", "Status update", "Invoice", "Quick question"})
	t := makeTool(r, name, "Send an email.", []param{{"to", "string", "Recipient address"}, {"subject", "string", "Subject line"}}, 2)
	q := fmt.Sprintf("Email %s with the subject \"%s\".", to, subject)
	return toolUse{tool: t, question: q, args: map[string]any{"to": to, "subject": subject}, argOrder: []string{"to", "subject"},
		result: `{"status": "sent"}`, answer: fmt.Sprintf("I sent the email \"%s\" to %s.", subject, to)}
}

var families = []family{weather, weather, weather, clock, readFile, listFiles, listFiles, search, calculate, convert, addTask, email}

// argsJSON writes the arguments in schema order, as a client's SDK would.
func argsJSON(u toolUse) string {
	var b strings.Builder
	b.WriteString("{")
	for i, k := range u.argOrder {
		if i > 0 {
			b.WriteString(", ")
		}
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(u.args[k])
		fmt.Fprintf(&b, "%s: %s", kb, vb)
	}
	b.WriteString("}")
	return b.String()
}

// toolCall is a conversation with one to four tools offered: the question needs one
// of them, the model calls it with arguments from the question, the tool answers and
// the model answers from the result. In some, the question needs none of them and
// the model answers directly.
func toolCall(r *rand.Rand) Conversation {
	n := 1 + r.IntN(4)
	var uses []toolUse
	seen := map[string]bool{}
	for len(uses) < n {
		u := pick(r, families)(r)
		if !seen[u.tool.Function.Name] {
			seen[u.tool.Function.Name] = true
			uses = append(uses, u)
		}
	}
	tools := make([]runnerapi.Tool, len(uses))
	for i, u := range uses {
		tools[i] = u.tool
	}
	var msgs []runnerapi.Message
	if chance(r, 0.3) {
		msgs = append(msgs, msg("system", pick(r, []string{"You are a helpful assistant with tools.",
			"Use the tools when they help.", "You are a helpful assistant."})))
	}
	if chance(r, 0.12) { // nothing to call
		q := question(r)
		msgs = append(msgs, msg("user", q.q), msg("assistant", q.a))
		return Conversation{Kind: "no-call", Tools: tools, Messages: msgs}
	}
	u := uses[r.IntN(len(uses))]
	msgs = append(msgs, callAndAnswer(u, callID(r))...)
	return Conversation{Kind: "tool-call", Tools: tools, Messages: msgs}
}

// callAndAnswer is u's turns: the question, the call (with id), the tool's result
// and the answer from it.
func callAndAnswer(u toolUse, id string) []runnerapi.Message {
	return []runnerapi.Message{msg("user", u.question),
		{Role: "assistant", ToolCalls: []runnerapi.ToolCall{{ID: id, Type: "function",
			Function: runnerapi.FunctionCall{Name: u.tool.Function.Name, Arguments: argsJSON(u)}}}},
		{Role: "tool", Content: runnerapi.MessageContent(u.result), ToolCallID: id},
		msg("assistant", u.answer)}
}
