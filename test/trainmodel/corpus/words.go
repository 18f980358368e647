package corpus

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// The word lists the generators draw from. Everything is invented for this corpus.

var cities = []string{"Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Lisbon", "Oslo", "Vienna",
	"Prague", "Dublin", "Cairo", "Nairobi", "Lagos", "Mumbai", "Delhi", "Seoul", "Beijing", "Sydney",
	"Toronto", "Chicago", "Boston", "Denver", "Seattle", "Austin", "Miami", "Lima", "Bogota", "Santiago",
	"Montreal", "Helsinki", "Stockholm", "Warsaw", "Athens", "Istanbul", "Dubai", "Singapore", "Bangkok",
	"Hanoi", "Manila", "Jakarta", "Auckland", "Cape Town", "New York", "San Francisco", "Los Angeles",
	"Mexico City", "Buenos Aires", "Zurich", "Amsterdam", "Brussels", "Copenhagen", "Budapest", "Kyoto",
	"Osaka", "Vancouver", "Melbourne", "Edinburgh", "Munich", "Barcelona", "Porto", "Nice", "Lyon"}

// countries pairs a country with its capital.
var countries = [][2]string{{"France", "Paris"}, {"Germany", "Berlin"}, {"Spain", "Madrid"}, {"Italy", "Rome"},
	{"Portugal", "Lisbon"}, {"Norway", "Oslo"}, {"Austria", "Vienna"}, {"Ireland", "Dublin"},
	{"Egypt", "Cairo"}, {"Kenya", "Nairobi"}, {"Japan", "Tokyo"}, {"South Korea", "Seoul"},
	{"China", "Beijing"}, {"India", "New Delhi"}, {"Canada", "Ottawa"}, {"Australia", "Canberra"},
	{"Peru", "Lima"}, {"Colombia", "Bogota"}, {"Chile", "Santiago"}, {"Finland", "Helsinki"},
	{"Sweden", "Stockholm"}, {"Poland", "Warsaw"}, {"Greece", "Athens"}, {"Thailand", "Bangkok"},
	{"Vietnam", "Hanoi"}, {"Mexico", "Mexico City"}, {"Argentina", "Buenos Aires"}, {"Denmark", "Copenhagen"},
	{"Hungary", "Budapest"}, {"Belgium", "Brussels"}, {"the Netherlands", "Amsterdam"}, {"Switzerland", "Bern"},
	{"Brazil", "Brasilia"}, {"Turkey", "Ankara"}, {"Iceland", "Reykjavik"}, {"New Zealand", "Wellington"}}

var people = []string{"Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy",
	"Mallory", "Niaj", "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Wendy", "Yusuf", "Zoe",
	"Amara", "Bruno", "Chen", "Dmitri", "Elena", "Farah", "Hugo", "Ines", "Kenji", "Leila", "Mateo", "Nora"}

var conditions = []string{"sunny", "cloudy", "rainy", "windy", "foggy", "snowing", "clear", "overcast",
	"partly cloudy", "stormy", "drizzling", "humid"}

var dirs = []string{".", "src", "docs", "test", "cmd", "internal", "scripts", "config", "notes", "/tmp",
	"/home/user/projects", "/var/log", "assets", "lib", "pkg/api", "web", "data", "examples", "build"}

var fileStems = []string{"main", "README", "notes", "config", "todo", "app", "server", "client", "utils",
	"index", "report", "data", "schema", "Makefile", "LICENSE", "setup", "handler", "model", "test_main",
	"CHANGELOG", "style", "routes", "db", "cache", "parser", "worker", "settings", "hello"}

var fileExts = []string{".go", ".md", ".txt", ".yaml", ".py", ".js", ".json", ".toml", ".sh", ".css", ".html", ".rs", ".c", ""}

var topics = []string{"rust ownership", "the history of tea", "solar panels", "how vaccines work",
	"the best pizza dough", "sourdough bread", "electric cars", "the moon landing", "black holes",
	"healthy breakfast ideas", "learning to juggle", "the tallest mountains", "coral reefs", "chess openings",
	"kubernetes operators", "quantum computing", "bird migration", "the water cycle", "volcanoes",
	"jazz music", "the printing press", "honey bees", "recycling plastic", "marathon training"}

var tasks = []string{"buy milk", "call the dentist", "water the plants", "review the pull request",
	"book a flight to Rome", "pay the electricity bill", "write the weekly report", "clean the garage",
	"renew my passport", "send the invoice", "fix the login bug", "plan the team lunch", "walk the dog"}

var currencies = []string{"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "INR"}

var colors = []string{"red", "green", "blue", "yellow", "purple", "orange", "black", "white", "pink", "brown"}

var fillerWords = strings.Fields(`the a an this that each every tool file command user task project code
	change test review answer request result output input function value directory path shell message
	session context model agent editor terminal repository branch commit build error warning line text
	should must can will may never always only when if then before after while with without for from into
	use run read write edit check keep make find show list explain describe prefer avoid follow ask
	clear short safe exact careful small simple local current relevant important useful complete new old
	and or but so because unless until also instead first next finally`)

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// chance is true with probability p.
func chance(r *rand.Rand, p float64) bool { return r.Float64() < p }

// fileName is a random file name.
func fileName(r *rand.Rand) string {
	stem := pick(r, fileStems)
	if stem == "Makefile" || stem == "LICENSE" {
		return stem
	}
	return stem + pick(r, fileExts[:len(fileExts)-1])
}

// filePath is a random path of a file, sometimes in a directory.
func filePath(r *rand.Rand) string {
	if chance(r, 0.4) {
		return fileName(r)
	}
	d := pick(r, dirs)
	if d == "." {
		d = "./" + pick(r, []string{"src", "docs", "notes"})
	}
	return d + "/" + fileName(r)
}

// fileList is n distinct file names.
func fileList(r *rand.Rand, n int) []string {
	seen := map[string]bool{}
	var out []string
	for len(out) < n {
		f := fileName(r)
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// and joins items as a sentence does: "a, b and c".
func and(items []string) string {
	switch len(items) {
	case 0:
		return "nothing"
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// filler is about n characters of instruction-like prose: what stands in for a
// coding agent's system prompt and tool descriptions, which the recorded requests
// redact.
func filler(r *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		words := 6 + r.IntN(12)
		for i := range words {
			w := pick(r, fillerWords)
			if i == 0 {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			b.WriteString(w)
			if i < words-1 {
				b.WriteByte(' ')
			}
		}
		b.WriteString(pick(r, []string{". ", ". ", ". ", ".\n", ".\n\n", ": ", "; "}))
	}
	return strings.TrimSpace(b.String())
}

// callID is a tool call id in the OpenAI style, drawn from r.
func callID(r *rand.Rand) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 24)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return fmt.Sprintf("call_%s", b)
}
