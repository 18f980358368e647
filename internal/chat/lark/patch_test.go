package lark

// patchGrammar is a grammar of the shape of a file-editing tool's patch language,
// written for these tests: a patch adds, deletes and updates files; an update moves
// the file and changes lines in hunks under optional context headers.
const patchGrammar = `
// A patch: its begin line, one or more file operations, its end line.
start: begin_patch operation+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

?operation: add_file | delete_file | update_file
add_file: "*** Add File: " path LF added_line+
delete_file: "*** Delete File: " path LF
update_file: "*** Update File: " path LF [move_to] hunk*

path: /[^\n]+/
move_to: "*** Move to: " path LF
added_line: "+" TEXT LF -> line
hunk: header (context_line | changed_line)+ end_of_file?
header: ("@@" | "@@ " TEXT) LF
context_line: " " TEXT LF
changed_line: ("+" | "-") TEXT LF
end_of_file: "*** End of File" LF
TEXT: /(.*)/

%import common.LF
`
