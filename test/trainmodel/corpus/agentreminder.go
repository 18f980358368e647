package corpus

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Claude Code writes reminders before the prompt, in the prompt's own user
// message: instructions between <system-reminder> tags that name files, commands,
// trailers and addresses the prompt does not ask about. The recorded requests
// redact them, and filled with prose they taught the model nothing about them: a
// model trained so read Claude Code 2.1.332's real reminder (how to sign commits
// and pull requests) and answered "List the files in this directory." with
// Bash({"command": "cat LICENSE"}) (docs/testing.md, "Codex's loop"). Generated
// here in that shape, they name things the prompt does not, so that the command
// follows the prompt. Every word is this corpus's own.

// reminderParts each write one paragraph of a reminder.
var reminderParts = []func(r *rand.Rand) string{signing, contextNote, changedFile, emptyTasks, checkCommands}

// claudeReminder is a reminder of one to three paragraphs.
func claudeReminder(r *rand.Rand) string {
	n := 1 + r.IntN(3)
	paras := make([]string, 0, n)
	for range n {
		paras = append(paras, pick(r, reminderParts)(r))
	}
	return "<system-reminder>\n" + strings.Join(paras, "\n\n") + "\n</system-reminder>"
}

var signedThings = []string{"git commit messages", "pull request descriptions", "release notes", "code review comments",
	"changelog entries", "issue comments"}

var trailers = []string{"Co-Authored-By", "Signed-off-by", "Reviewed-by", "Assisted-by", "Generated-by"}

var hosts = []string{"example.com", "example.org", "mail.example.net", "users.example.dev"}

// person is a name and an address.
func person(r *rand.Rand) string {
	p := pick(r, people)
	return fmt.Sprintf("%s <%s@%s>", p, strings.ToLower(p), pick(r, hosts))
}

// signing tells how to sign what the agent writes.
func signing(r *rand.Rand) string {
	a, b := pick(r, signedThings), pick(r, signedThings)
	return fmt.Sprintf("How to credit the %s you write from now on (this replaces any earlier note; the rules in %s "+
		"come first, but add nothing this note does not ask for):\n- End %s with:\n%s: %s\n- End %s with:\n"+
		"Written with help from https://%s/%s",
		a, pick(r, []string{"NOTES.md", "CONTRIBUTING.md", "the user's memory", "AGENTS.md", fileName(r)}), a,
		pick(r, trailers), person(r), b, pick(r, hosts), pick(r, projects))
}

// contextNote gives context that may not matter to the task.
func contextNote(r *rand.Rand) string {
	return fmt.Sprintf("Context for your answers, which may or may not be relevant to the task:\n# %s\n%s\n"+
		"# today\nThe date is %d-%02d-%02d.\nAnswer the task itself; use this context only where it helps.",
		fileName(r), filler(r, 60+r.IntN(200)), 2025+r.IntN(3), 1+r.IntN(12), 1+r.IntN(28))
}

// changedFile tells that a file changed outside the session.
func changedFile(r *rand.Rand) string {
	return fmt.Sprintf("%s was changed by the user or by a formatter since you last read it. Keep that change and "+
		"do not revert it unless asked; read it again before you edit it.", filePath(r))
}

// emptyTasks tells that the task list is empty.
func emptyTasks(r *rand.Rand) string {
	return fmt.Sprintf("The task list is empty. If the work has several steps, add them with the %s tool. "+
		"Do not mention this reminder to the user.", pick(r, []string{"TodoWrite", "TaskCreate", "Plan", "Tasks"}))
}

var checks = []string{"make test", "go vet ./...", "npm run lint", "cargo test", "pytest -q", "git status",
	"make check", "git diff --stat", "ruff check ."}

// checkCommands names commands to run at other times than now.
func checkCommands(r *rand.Rand) string {
	return fmt.Sprintf("Before you commit, run `%s`; after changing %s, run `%s`. Never push to %s.",
		pick(r, checks), fileName(r), pick(r, checks), pick(r, []string{"main", "master", "release", "the default branch"}))
}
