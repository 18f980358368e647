package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// config is the limits file: each measure's limit and the settings that say what the
// measures look at.
type config struct {
	limits map[string]int
	order  []string // the measures in the file's order

	poolPackage     string // the package whose locks and …Locked helpers are counted
	stateType       string // the pool's state type, which may have …Locked methods
	walks           []walk
	walkFields      bool     // whether a walk enters the functions stored in a func-typed field
	paramsUnder     string   // the folder whose functions' parameters are counted
	paramsMax       int      // the most parameters a function there may take
	bodyMax         int      // the most lines a function's body may run
	layerDoc        string   // the document with the layer table
	internalCeiling string   // the highest layer an internal/ package may import
	methodsUnder    []string // widest-method-set: the folders whose types' methods are counted
}

// walk is a call walk: its measures are NAME-stays and NAME-returns. With param, it
// follows that parameter of the root (follow.go) rather than every call.
type walk struct {
	name, pkg, root, param string
}

// readConfig reads a limits file. A line is `MEASURE LIMIT`, a setting `KEY VALUE`,
// `methods-under FOLDER...` or `walk NAME PACKAGE ROOT [PARAM]`; `#` starts a comment.
func readConfig(path string) (config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return config{}, err
	}
	cfg := config{
		limits:          map[string]int{},
		poolPackage:     "metal/enginepool",
		stateType:       "state",
		paramsUnder:     "gateway",
		paramsMax:       6,
		bodyMax:         80,
		layerDoc:        "docs/architecture.md",
		internalCeiling: "domain",
		walkFields:      true,
		methodsUnder:    []string{"metal/runner/server"},
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if err := cfg.set(fields); err != nil {
			return config{}, fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	return cfg, sc.Err()
}

// set applies one line of the limits file.
func (c *config) set(fields []string) error {
	key, args := fields[0], fields[1:]
	if key == "walk" {
		if len(args) != 3 && len(args) != 4 {
			return fmt.Errorf("want `walk NAME PACKAGE ROOT [PARAM]`, got %d values", len(args))
		}
		w := walk{name: args[0], pkg: args[1], root: args[2]}
		if len(args) == 4 {
			w.param = args[3]
		}
		c.walks = append(c.walks, w)
		return nil
	}
	if key == "methods-under" {
		if len(args) == 0 {
			return fmt.Errorf("want `methods-under FOLDER...`, got no folder")
		}
		c.methodsUnder = args
		return nil
	}
	if len(args) != 1 {
		return fmt.Errorf("want `%s VALUE`, got %d values", key, len(args))
	}
	var err error
	switch v := args[0]; key {
	case "pool-package":
		c.poolPackage = v
	case "state-type":
		c.stateType = v
	case "params-under":
		c.paramsUnder = v
	case "params-max":
		c.paramsMax, err = strconv.Atoi(v)
	case "body-max":
		c.bodyMax, err = strconv.Atoi(v)
	case "layer-doc":
		c.layerDoc = v
	case "internal-ceiling":
		c.internalCeiling = v
	case "walk-fields":
		c.walkFields, err = strconv.ParseBool(v)
	default:
		limit, perr := strconv.Atoi(v)
		if perr != nil || limit < 0 {
			return fmt.Errorf("%s: the limit %q is not a count", key, v)
		}
		if _, dup := c.limits[key]; dup {
			return fmt.Errorf("%s has two limits", key)
		}
		c.limits[key] = limit
		c.order = append(c.order, key)
	}
	return err
}
