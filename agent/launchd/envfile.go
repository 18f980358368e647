package launchd

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// EnvFileFlag is the macfleet flag that names a file of KEY=VALUE lines to set in the
// environment before the command runs. A service installed with environment
// variables is given it instead of launchd's EnvironmentVariables: the property list
// is readable by every user of the Mac, and the variables are often secrets (HF_TOKEN,
// a proxy's credentials).
const EnvFileFlag = "--env-file"

// envFileMode is the env file's mode: its owner's alone.
const envFileMode = 0o600

// EncodeEnv is the env file of the KEY=VALUE pairs kvs, one a line, sorted by key; the
// last value of a key wins, as in a shell. A key or value with a line break is refused.
func EncodeEnv(kvs []string) ([]byte, error) {
	d, err := envDict(kvs)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for _, e := range d {
		v := e.value.(string)
		if strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("environment variable %s: a value cannot hold a line break", e.key)
		}
		fmt.Fprintf(&buf, "%s=%s\n", e.key, v)
	}
	return buf.Bytes(), nil
}

// DecodeEnv parses an env file: KEY=VALUE lines; blank lines and lines starting with
// # are skipped. The value is everything after the first '=', as written.
func DecodeEnv(data []byte) ([][2]string, error) {
	var out [][2]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("line %d: want KEY=VALUE", n)
		}
		out = append(out, [2]string{k, v})
	}
	return out, sc.Err()
}

// LoadEnvFile sets the variables of the env file at path in this process's
// environment (and so in the processes it starts).
func LoadEnvFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", EnvFileFlag, err)
	}
	kvs, err := DecodeEnv(data)
	if err != nil {
		return fmt.Errorf("%s %s: %w", EnvFileFlag, path, err)
	}
	for _, kv := range kvs {
		if err := os.Setenv(kv[0], kv[1]); err != nil {
			return fmt.Errorf("%s %s: setting %s: %w", EnvFileFlag, path, kv[0], err)
		}
	}
	return nil
}

// writeEnvFile writes p's env file (mode 0600, owned by p.Owner when set) through a
// temporary file, so that no reader ever sees it with a wider mode or half written.
func writeEnvFile(p *Plan) error {
	if p.EnvFile == "" {
		return nil
	}
	tmp := p.EnvFile + ".tmp"
	_ = os.Remove(tmp) // a leftover could have another mode; OpenFile's mode applies only to a new file
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, envFileMode)
	if err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	_, err = f.Write(p.Env)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && p.Owner != nil {
		err = os.Chown(tmp, p.Owner.UID, p.Owner.GID)
	}
	if err == nil {
		err = os.Chmod(tmp, envFileMode) // the umask cannot have narrowed it, but be exact
	}
	if err == nil {
		err = os.Rename(tmp, p.EnvFile)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("installing %s: %w", p.EnvFile, err)
	}
	return nil
}
