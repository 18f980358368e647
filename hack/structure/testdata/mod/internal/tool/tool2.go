package tool

import "example.com/mod/controllers/ctl"

// A second import of the same package from the same package is not counted again.
var other = ctl.Name
