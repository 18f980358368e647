package runnerapi

// InputGrammar is a freeform tool's grammar (a macfleet extension of a function
// tool, which the Responses API's custom tools become): the function takes one string
// parameter, "input", and the runner holds what the model writes there to the grammar
// when it constrains the call (tool_choice "required" or naming the function, or,
// under "auto", once the model opens a call in a format whose call opener is known).
type InputGrammar struct {
	// Syntax is "lark" (a Lark grammar, start rule "start") or "regex" (a regular
	// expression the whole input matches).
	Syntax string `json:"syntax"`
	// Definition is the grammar's text.
	Definition string `json:"definition"`
}
