//go:build cgo && !race

package llama

import "regexp"

// The JSON-schema converter's rule for strings of format "date" (and "date-time")
// takes any day from 01 to 31 in any month, so a constrained answer could say
// 2023-09-31 or 2023-02-29, which no validator of the schema accepts
// (TestStructuredOutputs met one at temperature 1). calendarDates puts in its place a
// rule of the Gregorian calendar: 30 days in April, June, September and November, 28
// in February, and February 29 in leap years (divisible by 4, the hundreds only when
// divisible by 400).

// converterDate is the converter's rule for "date", by its name and its first
// element, a year of four digits.
var converterDate = regexp.MustCompile(`(?m)^date ::= \[0-9\]\{4\} "-" .*$`)

// calendarDate is the rule that replaces it, and the rule it uses for leap years.
const calendarDate = `date ::= [0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) | date-leap-year "-02-29"
date-leap-year ::= [0-9] [0-9] ( "0" [48] | [2468] [048] | [13579] [26] ) | ( "0" [048] | [2468] [048] | [13579] [26] ) "00"`

// calendarDates is gbnf with the converter's date rule, if any, replaced by calendarDate.
func calendarDates(gbnf string) string {
	return converterDate.ReplaceAllLiteralString(gbnf, calendarDate)
}
