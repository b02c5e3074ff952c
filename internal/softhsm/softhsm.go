// Package softhsm makes SoftHSM2 tokens for tests of the PKCS#11
// upstream, with Debian's softhsm2 and opensc packages (hack/deps.sh
// installs them): a configuration whose token directory is the test's
// own, tokens initialised with softhsm2-util, and their objects read back
// with pkcs11-tool, independently of meshca's PKCS#11 library.
package softhsm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Module is Debian's SoftHSM2 PKCS#11 module.
const Module = "/usr/lib/softhsm/libsofthsm2.so"

// ConfEnv is the variable SoftHSM2 reads its configuration's path from.
const ConfEnv = "SOFTHSM2_CONF"

// Available reports what is missing to run SoftHSM2 here, or nil.
func Available() error {
	var missing []string
	if _, err := os.Stat(Module); err != nil {
		missing = append(missing, Module+" (Debian package softhsm2)")
	}
	for _, bin := range []struct{ name, pkg string }{{"softhsm2-util", "softhsm2"}, {"pkcs11-tool", "opensc"}} {
		if _, err := exec.LookPath(bin.name); err != nil {
			missing = append(missing, bin.name+" (Debian package "+bin.pkg+")")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("softhsm: missing %s: run hack/deps.sh softhsm2 opensc", strings.Join(missing, ", "))
	}
	return nil
}

// A Dir is a SoftHSM2 configuration and the directory of its tokens.
type Dir struct {
	// Conf is the configuration file: SOFTHSM2_CONF's value.
	Conf string
	// Tokens holds the tokens' files.
	Tokens string
}

// NewDir writes a configuration under dir whose tokens are in dir too.
func NewDir(dir string) (*Dir, error) {
	d := &Dir{Conf: filepath.Join(dir, "softhsm2.conf"), Tokens: filepath.Join(dir, "tokens")}
	if err := os.MkdirAll(d.Tokens, 0o700); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n", d.Tokens)
	if err := os.WriteFile(d.Conf, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	return d, nil
}

// Env is the environment entry that points SoftHSM2 at d.
func (d *Dir) Env() string { return ConfEnv + "=" + d.Conf }

// InitToken initialises a new token in the first free slot.
func (d *Dir) InitToken(label, pin, soPIN string) error {
	_, err := d.run("softhsm2-util", "--init-token", "--free", "--label", label, "--pin", pin, "--so-pin", soPIN)
	return err
}

// An Object is one object of a token as pkcs11-tool lists it.
type Object struct {
	// Class is "Private Key", "Public Key", "Certificate", ...; KeyType
	// "EC", "RSA", ...
	Class, KeyType string
	Label, ID      string // ID in hex, as pkcs11-tool prints it
	// Usage and Access are the words pkcs11-tool prints from the
	// object's attributes: Usage "sign", "decrypt", ...; Access
	// "sensitive", "always sensitive", "never extractable", "local", ...
	Usage, Access []string
}

// Objects lists the objects of the token labelled token that pkcs11-tool
// sees, logged in with pin, or without logging in when pin is empty (a
// private object is then invisible).
func (d *Dir) Objects(token, pin string) ([]Object, error) {
	args := []string{"--module", Module, "--token-label", token, "--list-objects"}
	if pin != "" {
		args = append(args, "--login", "--pin", pin)
	}
	out, err := d.run("pkcs11-tool", args...)
	if err != nil {
		return nil, err
	}
	return parseObjects(out), nil
}

// parseObjects reads pkcs11-tool --list-objects: a line per object
// ("Private Key Object; EC"), its attributes indented below.
func parseObjects(out []byte) []Object {
	var objs []Object
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if class, rest, ok := strings.Cut(line, " Object;"); ok && !strings.HasPrefix(line, " ") {
			kt, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
			objs = append(objs, Object{Class: class, KeyType: kt})
			continue
		}
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || len(objs) == 0 {
			continue
		}
		o := &objs[len(objs)-1]
		value = strings.TrimSpace(value)
		switch name {
		case "label":
			o.Label = value
		case "ID":
			o.ID = value
		case "Usage":
			o.Usage = words(value)
		case "Access":
			o.Access = words(value)
		}
	}
	return objs
}

func words(list string) []string {
	var out []string
	for _, w := range strings.Split(list, ",") {
		if w = strings.TrimSpace(w); w != "" && w != "none" {
			out = append(out, w)
		}
	}
	return out
}

// run runs a SoftHSM2 tool on d's configuration.
func (d *Dir) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), d.Env())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return out, fmt.Errorf("softhsm: %s: %w", name, err)
	}
	return out, nil
}
