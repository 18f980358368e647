package launchd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Installed is a service as its installed property list describes it: what Install
// wrote, read back so that uninstalling removes what was installed, wherever its
// flags put it.
type Installed struct {
	Service Service
	// PlistPath is the property list's path and Domain the launchctl domain it is
	// loaded into.
	PlistPath, Domain string
	// Args are the service command's flags (ProgramArguments after the executable
	// and the subcommand).
	Args []string
	// StdoutPath and StderrPath are its log files; DataDir its working directory.
	StdoutPath, StderrPath, DataDir string
	// User is the account a LaunchDaemon runs as ("" for root).
	User string
}

// ErrNotInstalled: no property list of the service where it would be.
var ErrNotInstalled = errors.New("not installed")

// ReadInstalled reads the property list of svc at path (loaded into domain). It
// returns an error wrapping ErrNotInstalled when there is none, and refuses one that
// is not svc's: a file of another label or command is left alone.
func ReadInstalled(svc Service, path, domain string) (*Installed, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", path, ErrNotInstalled)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	plist, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	in := &Installed{Service: svc, PlistPath: path, Domain: domain}
	var args []string
	if arr, ok := plist["ProgramArguments"].([]any); ok {
		for _, a := range arr {
			s, _ := a.(string)
			args = append(args, s)
		}
	}
	if plist["Label"] != svc.Label || len(args) < 2 || args[1] != svc.Command {
		return nil, fmt.Errorf("%s is not the property list `macfleet %s install` writes (label %v, arguments %q): remove it yourself",
			path, svc.Command, plist["Label"], args)
	}
	in.Args = args[2:]
	in.StdoutPath, _ = plist["StandardOutPath"].(string)
	in.StderrPath, _ = plist["StandardErrorPath"].(string)
	in.DataDir, _ = plist["WorkingDirectory"].(string)
	in.User, _ = plist["UserName"].(string)
	return in, nil
}

// Flag is the value of flag in the service's arguments.
func (in *Installed) Flag(flag string) (string, bool) {
	v, found, err := flagValue(in.Args, flag)
	return v, found && err == nil && v != ""
}

// Item is a file or directory that uninstalling removes or keeps.
type Item struct {
	Path string
	// What it is; Why, for a kept item, why it stays or how to remove it.
	What, Why string
}

// Removal is what uninstalling a service removes and what it keeps.
type Removal struct {
	Remove, Keep []Item
	// EmptyDirs are removed last, each only if nothing is left in it.
	EmptyDirs []string
}

// RemovalOptions say what an uninstall removes beyond the service itself.
type RemovalOptions struct {
	// Purge removes the model store, the prompt cache and the logs too.
	Purge bool
	// KeepCredential keeps the agent's node credential and TLS key.
	KeepCredential bool
	// NodeCredential says that the agent's kubeconfig holds a node token macfleet
	// issued (the caller reads it); any other kubeconfig is the user's and stays.
	NodeCredential bool
	// Others are the other macfleet services installed beside this one: what they
	// use stays.
	Others []*Installed
	// Home is the user's home directory, never removed.
	Home string
}

// PlanRemoval decides what uninstalling in removes: the property list always; the
// agent's node credential and state (its TLS key pinned to the Mac, its runners'
// records) unless o.KeepCredential; with o.Purge the service's data directories and
// logs, except what another installed service uses.
func PlanRemoval(in *Installed, o RemovalOptions) Removal {
	r := Removal{Remove: []Item{{Path: in.PlistPath, What: "the launchd service"}}}
	if env, ok := in.Flag(EnvFileFlag); ok {
		// Its secrets go with the service that read them.
		r.Remove = append(r.Remove, Item{Path: env, What: "the service's environment file"})
	}
	if in.Service.NeedsKubeconfig {
		if kc, ok := in.Flag(KubeconfigFlag); ok {
			it := Item{Path: kc, What: "the agent's kubeconfig"}
			switch {
			case o.KeepCredential:
				r.Keep = append(r.Keep, with(it, "kept with --keep-credential"))
			case !o.NodeCredential:
				r.Keep = append(r.Keep, with(it, "not a node token of `macfleet nodes credentials`: yours to remove"))
			default:
				it.What = "the node credential"
				r = r.remove(it, o)
			}
		}
	}
	for _, d := range in.Service.Dirs {
		dir, ok := in.Flag(d.Flag)
		if !ok {
			continue
		}
		it := Item{Path: dir, What: dirWhat(d.Flag)}
		switch {
		case d.Flag == StateFlag && o.KeepCredential:
			r.Keep = append(r.Keep, with(it, "holds the TLS key pinned to this Mac: kept with --keep-credential"))
		case d.Flag == StateFlag:
			r = r.remove(it, o)
		case !o.Purge:
			r.Keep = append(r.Keep, with(it, "--purge removes it"))
		default:
			r = r.remove(it, o)
		}
	}
	for _, log := range []string{in.StdoutPath, in.StderrPath} {
		if log == "" {
			continue
		}
		if it := (Item{Path: log, What: "log"}); o.Purge {
			r = r.remove(it, o)
		} else {
			r.Keep = append(r.Keep, with(it, "--purge removes it"))
		}
	}
	for _, dir := range []string{in.DataDir, filepath.Dir(in.StdoutPath)} {
		if dir != "" && dir != "." && !tooBroad(dir, o.Home) {
			r.EmptyDirs = append(r.EmptyDirs, dir)
		}
	}
	return r
}

// remove adds it to what is removed, unless another service uses it or its path is
// too broad to remove, in which case it is kept and says why.
func (r Removal) remove(it Item, o RemovalOptions) Removal {
	if tooBroad(it.Path, o.Home) {
		r.Keep = append(r.Keep, with(it, "too broad a path to remove: remove what macfleet put there yourself"))
		return r
	}
	for _, other := range o.Others {
		if other.uses(it.Path) {
			r.Keep = append(r.Keep, with(it, "also used by "+other.Service.Label))
			return r
		}
	}
	r.Remove = append(r.Remove, it)
	return r
}

func with(it Item, why string) Item {
	it.Why = why
	return it
}

// uses says whether path is, holds or lies in a path the service is given.
func (in *Installed) uses(path string) bool {
	var paths []string
	for _, flag := range in.Service.PathFlags {
		if v, ok := in.Flag(flag); ok {
			paths = append(paths, v)
		}
	}
	for _, p := range append(paths, in.StdoutPath, in.StderrPath) {
		if p != "" && (within(p, path) || within(path, p)) {
			return true
		}
	}
	return false
}

// within says whether path is dir or lies under it.
func within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// tooBroad refuses to remove a relative path, one of fewer than two components
// (/, /Users, /Volumes) or one that is or holds the home directory.
func tooBroad(path, home string) bool {
	if !filepath.IsAbs(path) {
		return true
	}
	path = filepath.Clean(path)
	if strings.Count(path, "/") < 2 {
		return true
	}
	return home != "" && within(home, path)
}

func dirWhat(flag string) string {
	switch flag {
	case StoreFlag:
		return "the model store"
	case StateFlag:
		return "the agent's state: its TLS key pinned to this Mac, its runners' records"
	case PromptCacheFlag:
		return "the prompt cache"
	}
	return strings.TrimPrefix(flag, "--")
}

// Unload boots the service out of its domain if it is loaded there, and says whether
// it was.
func Unload(ctx context.Context, in *Installed, launchctl Launchctl) (bool, error) {
	target := in.Domain + "/" + in.Service.Label
	if _, err := launchctl(ctx, "print", target); err != nil {
		return false, nil
	}
	if out, err := launchctl(ctx, "bootout", target); err != nil {
		return false, fmt.Errorf("unloading %s: launchctl bootout: %w: %s", target, err, strings.TrimSpace(string(out)))
	}
	return true, nil
}

// Apply removes what r removes, then each of r.EmptyDirs left empty, and returns the
// items it removed (a missing one counts as removed) with the errors of the others.
func Apply(r Removal) ([]Item, error) {
	var (
		done []Item
		errs []error
	)
	for _, it := range r.Remove {
		if err := os.RemoveAll(it.Path); err != nil {
			errs = append(errs, fmt.Errorf("removing %s (%s): %w", it.Path, it.What, err))
			continue
		}
		done = append(done, it)
	}
	for _, dir := range r.EmptyDirs {
		_ = os.Remove(dir) // fails, as it should, while anything is left in it
	}
	return done, errors.Join(errs...)
}
