package corpus

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func msg(role, content string) runnerapi.Message {
	return runnerapi.Message{Role: role, Content: runnerapi.MessageContent(content)}
}

var systemPrompts = []string{"You are a helpful assistant.", "You are a friendly assistant. Answer briefly.",
	"You are a concise assistant.", "Answer in one or two sentences.", "You are a helpful, honest assistant.",
	"You help users with short, clear answers."}

// withSystem prepends a system message to about a third of the conversations.
func withSystem(r *rand.Rand, msgs ...runnerapi.Message) []runnerapi.Message {
	if chance(r, 0.35) {
		return append([]runnerapi.Message{msg("system", pick(r, systemPrompts))}, msgs...)
	}
	return msgs
}

var greetings = [][2][]string{
	{{"Hi", "Hi!", "Hello", "Hello!", "Hey", "Hey there", "Hi there!", "Good morning", "Good evening", "hello", "hi"},
		{"Hello! How can I help you today?", "Hi! What can I do for you?", "Hello! What would you like to know?",
			"Hi there! How can I help?", "Hello! I'm here to help. What do you need?"}},
	{{"How are you?", "How are you doing today?", "Hi, how are you?", "How's it going?"},
		{"I'm doing well, thank you for asking. How can I help you today?",
			"I'm fine, thanks! What can I do for you?", "All good here. What would you like to talk about?"}},
	{{"Who are you?", "What are you?", "Hello, who are you?", "What can you do?"},
		{"I am a small assistant model. I can answer short questions, call tools and write JSON.",
			"I'm a small test assistant. I answer questions in short sentences and can use tools.",
			"I am a helpful assistant. Ask me a question, or give me tools to use."}},
	{{"Thanks!", "Thank you", "Thanks a lot.", "Great, thank you!"},
		{"You're welcome! Let me know if you need anything else.", "Glad I could help!", "Any time!"}},
	{{"Say this is a test", "Say this is a test.", "Say \"this is a test\"", "Please say this is a test."},
		{"This is a test.", "This is a test."}},
	{{"Say hello", "Say hi", "Say hello world", "Greet me"},
		{"Hello!", "Hi!", "Hello, world!", "Hello! Nice to meet you."}},
	{{"Tell me a joke", "Tell me a short joke.", "Make me laugh"},
		{"Why did the developer go broke? Because he used up all his cache.",
			"I told my computer a joke about UDP, but I am not sure it got it.",
			"Why do programmers prefer dark mode? Because light attracts bugs."}},
	{{"Write a haiku about the sea.", "Write a short poem about the sea."},
		{"Waves fold into foam,\nthe tide keeps its slow promise,\nsalt wind carries home."}},
	{{"Count to five.", "Count from one to five."}, {"One, two, three, four, five."}},
}

var greeted = []string{"the fleet", "the team", "everyone", "the world", "my friends", "the class", "the group"}

func greeting(r *rand.Rand) Conversation {
	if chance(r, 0.15) { // a greeting passed on
		who := pick(r, greeted)
		if chance(r, 0.4) {
			who = pick(r, people)
		}
		ask := fmt.Sprintf(pick(r, []string{"Say hello to %s.", "Say hi to %s", "Greet %s.", "Please say hello to %s!"}), who)
		name := strings.TrimPrefix(strings.TrimPrefix(who, "the "), "my ")
		ans := fmt.Sprintf(pick(r, []string{"Hello, %s!", "Hi, %s! Nice to meet you.", "Hello, %s! How are you today?"}), name)
		return Conversation{Kind: "greeting", Messages: withSystem(r, msg("user", ask), msg("assistant", ans))}
	}
	g := pick(r, greetings)
	return Conversation{Kind: "greeting", Messages: withSystem(r, msg("user", pick(r, g[0])), msg("assistant", pick(r, g[1])))}
}

// qa is one question and its answer in a sentence; the answer's reasoning for think.
type qa struct{ q, a, why string }

var opWords = []struct {
	sym, word string
	f         func(a, b int) int
}{
	{"+", "plus", func(a, b int) int { return a + b }},
	{"-", "minus", func(a, b int) int { return a - b }},
	{"*", "times", func(a, b int) int { return a * b }},
}

func arithmetic(r *rand.Rand) qa {
	op := pick(r, opWords)
	a, b := r.IntN(50)+1, r.IntN(20)+1
	v := op.f(a, b)
	q := pick(r, []string{"What is %d %s %d?", "What's %d %s %d?", "Compute %d %s %d.", "How much is %d %s %d?"})
	name := op.word
	if chance(r, 0.4) {
		name = op.sym
	}
	return qa{q: fmt.Sprintf(q, a, name, b), a: fmt.Sprintf("%d %s %d is %d.", a, op.word, b, v),
		why: fmt.Sprintf("I need %d %s %d. %d %s %d = %d.", a, op.word, b, a, op.sym, b, v)}
}

func capital(r *rand.Rand) qa {
	c := pick(r, countries)
	q := pick(r, []string{"What is the capital of %s?", "What's the capital of %s?", "Capital of %s?",
		"Which city is the capital of %s?", "Tell me the capital of %s."})
	return qa{q: fmt.Sprintf(q, c[0]), a: fmt.Sprintf("The capital of %s is %s.", c[0], c[1]),
		why: fmt.Sprintf("The question asks for the capital of %s. That is %s.", c[0], c[1])}
}

var facts = []qa{
	{"What color is the sky on a clear day?", "The sky is blue on a clear day.", "Sunlight scatters most in the blue part of the spectrum."},
	{"How many days are in a week?", "There are seven days in a week.", "Monday to Sunday makes seven days."},
	{"How many legs does a spider have?", "A spider has eight legs.", "Spiders are arachnids, and arachnids have eight legs."},
	{"What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level.", "At normal pressure water boils at 100 °C."},
	{"What is the largest planet in our solar system?", "Jupiter is the largest planet in our solar system.", "Jupiter is bigger than all other planets together."},
	{"How many minutes are in an hour?", "There are 60 minutes in an hour.", "One hour has sixty minutes."},
	{"What do bees make?", "Bees make honey.", "Bees turn nectar into honey."},
	{"What is the opposite of hot?", "The opposite of hot is cold.", "Hot and cold are opposites."},
	{"How many continents are there?", "There are seven continents.", "Africa, Antarctica, Asia, Australia, Europe, North America and South America: seven."},
	{"What is H2O?", "H2O is water.", "Two hydrogen atoms and one oxygen atom make water."},
	{"What is the freezing point of water?", "Water freezes at 0 degrees Celsius.", "At normal pressure water freezes at 0 °C."},
	{"Which animal is known as the king of the jungle?", "The lion is known as the king of the jungle.", "That nickname belongs to the lion."},
	{"What is a prime number?", "A prime number is a whole number greater than 1 that only divides by 1 and itself.", "Primes have exactly two divisors."},
	{"What does CPU stand for?", "CPU stands for central processing unit.", "C is central, P is processing, U is unit."},
	{"What is the plural of mouse?", "The plural of mouse is mice.", "Mouse is irregular: mice."},
	{"How many hours are in a day?", "There are 24 hours in a day.", "A day has twenty-four hours."},
	{"What language is spoken in Brazil?", "Portuguese is spoken in Brazil.", "Brazil was a Portuguese colony."},
	{"Is the sun a star?", "Yes, the sun is a star.", "The sun is a G-type main-sequence star."},
	{"What is the square root of 81?", "The square root of 81 is 9.", "9 times 9 is 81."},
	{"How many sides does a triangle have?", "A triangle has three sides.", "Tri means three."},
}

func question(r *rand.Rand) qa {
	switch r.IntN(3) {
	case 0:
		return arithmetic(r)
	case 1:
		return capital(r)
	}
	return pick(r, facts)
}

func answer(r *rand.Rand) Conversation {
	q := question(r)
	msgs := withSystem(r, msg("user", q.q), msg("assistant", q.a))
	if chance(r, 0.25) { // a second turn
		q2 := question(r)
		msgs = append(msgs, msg("user", q2.q), msg("assistant", q2.a))
	}
	if chance(r, 0.15) { // a greeting first
		g := pick(r, greetings[:2])
		msgs = append([]runnerapi.Message{msg("user", pick(r, g[0])), msg("assistant", pick(r, g[1]))}, msgs...)
	}
	return Conversation{Kind: "answer", Messages: msgs}
}

var thinkAsks = []string{"Think step by step. %s", "%s Think it through first.", "%s Reason before you answer.",
	"Let's think about this: %s", "%s Show your reasoning.", "%s Think carefully."}

var thinkSystems = []string{"Think before you answer, inside <think> tags, then answer.",
	"Reason step by step inside <think></think>, then give the answer.", "You are a reasoning assistant. Think first in <think> tags."}

// think is a question answered after a <think> section: when the user or the
// system asks for reasoning.
func think(r *rand.Rand) Conversation {
	q := question(r)
	var msgs []runnerapi.Message
	if chance(r, 0.5) {
		msgs = []runnerapi.Message{msg("system", pick(r, thinkSystems)), msg("user", q.q)}
	} else {
		msgs = []runnerapi.Message{msg("user", fmt.Sprintf(pick(r, thinkAsks), q.q))}
	}
	sep := pick(r, []string{"\n\n", "\n"})
	msgs = append(msgs, msg("assistant", "<think>\n"+q.why+"\n</think>"+sep+q.a))
	return Conversation{Kind: "think", Messages: msgs}
}

// jsonAnswer is a short JSON object asked for in words, by a system prompt, or by a
// described schema (what response_format requests look like once rendered: the
// runner constrains the output with a grammar and the model fills the values).
func jsonAnswer(r *rand.Rand) Conversation {
	var ask, out string
	switch r.IntN(5) {
	case 0:
		p, c, age := pick(r, people), pick(r, cities), 18+r.IntN(60)
		ask = fmt.Sprintf("%s is %d years old and lives in %s. Give me JSON with name, age and city.", p, age, c)
		out = fmt.Sprintf(`{"name": "%s", "age": %d, "city": "%s"}`, p, age, c)
	case 1:
		c := pick(r, countries)
		ask = fmt.Sprintf("Return a JSON object with the country and capital of %s.", c[0])
		out = fmt.Sprintf(`{"country": "%s", "capital": "%s"}`, c[0], c[1])
	case 2:
		q := arithmetic(r)
		ask = q.q + " Answer in JSON with the key answer."
		out = fmt.Sprintf(`{"answer": %s}`, strings.TrimSuffix(q.a[strings.LastIndex(q.a, " ")+1:], "."))
	case 3:
		n := 2 + r.IntN(3)
		cs := make([]string, n)
		for i := range cs {
			cs[i] = fmt.Sprintf("%q", colors[(r.IntN(len(colors))+i)%len(colors)])
		}
		ask = fmt.Sprintf("List %d colors as JSON.", n)
		out = fmt.Sprintf(`{"colors": [%s]}`, strings.Join(cs, ", "))
	default:
		c, cond, temp := pick(r, cities), pick(r, conditions), r.IntN(35)-5
		ask = fmt.Sprintf("Describe the weather: %s, %d degrees, %s. Reply with a JSON object.", c, temp, cond)
		out = fmt.Sprintf(`{"city": "%s", "temperature": %d, "condition": "%s"}`, c, temp, cond)
	}
	var msgs []runnerapi.Message
	if chance(r, 0.4) {
		sys := pick(r, []string{"Respond only with a JSON object.", "You output JSON and nothing else.",
			"Answer with a single JSON object, no prose."})
		msgs = append(msgs, msg("system", sys))
	}
	msgs = append(msgs, msg("user", ask), msg("assistant", out))
	return Conversation{Kind: "json", Messages: msgs}
}
