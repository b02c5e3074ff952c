package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/spf13/pflag"
)

// signerBackend describes one signer backend to every command, once: its
// file (backend_<name>.go) registers it with registerSigner, and serve's
// flags, help, config file keys and checks and the root steps' signer
// side all come from the registered descriptors.
type signerBackend struct {
	// name is --signer's value; usage what it is, for --signer's help.
	name, usage string
	// helpGroup titles its serve flags in the help; keyFlags are those
	// the short help names. Its flags are named <name>-..., and their
	// config file keys are in the section <name> (cfssl.url).
	helpGroup string
	keyFlags  []string
	// serve makes its serve flags; nil: it has none.
	serve func() serveOptions
	// root makes its side of the rotation steps, rootUsage says what a
	// step changes in it; nil: meshca root takes no step with it
	// (--signer refuses it).
	root      func() rootOptions
	rootUsage string
	// ownCA: meshca holds the signing key in process and issues its own
	// X509-SVIDs with it (the bundle endpoint's https_spiffe profile).
	ownCA bool
	// noPodCertificates says why it cannot sign pod certificates; empty:
	// it can.
	noPodCertificates string
}

// serveOptions are a backend's serve flags.
type serveOptions interface {
	register(fl *pflag.FlagSet)
	// validate checks them without I/O; common holds the flags every
	// backend shares.
	validate(common *backendFlags) error
	// load reads the files they name into c.
	load(common *backendFlags, c *serve.Backend, log *slog.Logger) error
}

// rootOptions are a backend's flags of a rotation step.
type rootOptions interface {
	// register registers those that apply to step: prepare, activate or
	// retire.
	register(fl *pflag.FlagSet, step string)
	// open returns the backend's side of the step, which reports on out.
	open(ctx context.Context, out io.Writer) (rootBackend, error)
}

// signerBackends are the registered backends, the default first.
var signerBackends []*signerBackend

// registerSigner adds b to the backends.
func registerSigner(b *signerBackend) {
	signerBackends = append(signerBackends, b)
	slices.SortStableFunc(signerBackends, func(x, y *signerBackend) int {
		switch {
		case x.name == signerLocal:
			return -1
		case y.name == signerLocal:
			return 1
		}
		return strings.Compare(x.name, y.name)
	})
}

// signerNamed is the backend named name, nil when none is.
func signerNamed(name string) *signerBackend {
	for _, b := range signerBackends {
		if b.name == name {
			return b
		}
	}
	return nil
}

// signerNames lists the names of the backends keep admits, "a, b or c".
func signerNames(keep func(*signerBackend) bool) string {
	var names []string
	for _, b := range signerBackends {
		if keep(b) {
			names = append(names, b.name)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// signerSection is the config file section of flag, a backend's, and the
// rest of the flag's name; ok is false for a flag of no backend.
func signerSection(flag string) (section, rest string, ok bool) {
	for _, b := range signerBackends {
		if rest, ok := strings.CutPrefix(flag, b.name+"-"); ok && b.serve != nil {
			return b.name, rest, true
		}
	}
	return "", "", false
}

// envCfsslAuthKey may carry the cfssl auth key instead of a file.
const envCfsslAuthKey = "MESHCA_CFSSL_AUTH_KEY"

// backendFlags select and configure the signer: the flags every backend
// shares, and each backend's own.
type backendFlags struct {
	signer       string
	trustAnchors string
	servingCert  string
	servingKey   string
	// opts are each backend's serve flags, by name.
	opts map[string]serveOptions
	// hasState: the trust bundle comes from a CA state (--state-dir or
	// --state-secret), not from --trust-anchors.
	hasState bool
}

// registerSigner registers the choice of backend and the roots it needs.
func (b *backendFlags) registerSigner(fl *pflag.FlagSet) {
	var uses []string
	for _, s := range signerBackends {
		uses = append(uses, s.usage)
	}
	fl.StringVar(&b.signer, "signer", signerLocal, "signing backend: "+strings.Join(uses, ", "))
	fl.StringVar(&b.trustAnchors, "trust-anchors", "", "PEM roots workloads trust, pinned, for external backends; or give them a CA state (--state-dir, --state-secret) that \"meshca root\" rotates")
}

// registerServing registers the serving certificate of external backends.
func (b *backendFlags) registerServing(fl *pflag.FlagSet) {
	fl.StringVar(&b.servingCert, "serving-cert-file", "", "serving certificate chain (PEM, leaf first) for external backends; must chain to the trust bundle "+
		"(--trust-anchors or the CA state's); followed: a renewed pair that verifies serves the next handshakes, any other is refused and logged")
	fl.StringVar(&b.servingKey, "serving-key-file", "", "serving certificate key (PEM), followed with --serving-cert-file")
}

// groups are the help groups of the backends' own flags, each
// registering them.
func (b *backendFlags) groups() []flagGroup {
	var out []flagGroup
	for _, s := range signerBackends {
		if s.serve == nil {
			continue
		}
		out = append(out, flagGroup{s.helpGroup, s.keyFlags, func(fl *pflag.FlagSet) { b.options(s).register(fl) }})
	}
	return out
}

// options are the serve flags of s, made on first use.
func (b *backendFlags) options(s *signerBackend) serveOptions {
	if b.opts == nil {
		b.opts = map[string]serveOptions{}
	}
	o, ok := b.opts[s.name]
	if !ok {
		o = s.serve()
		b.opts[s.name] = o
	}
	return o
}

// selected is the backend --signer names, or an error saying which
// there are.
func (b *backendFlags) selected() (*signerBackend, error) {
	s := signerNamed(b.signer)
	if s == nil {
		return nil, fmt.Errorf("%s: %q is not one of %s", name("signer"), b.signer, signerNames(func(*signerBackend) bool { return true }))
	}
	return s, nil
}

// validate checks the selection without I/O.
func (b *backendFlags) validate() error {
	s, err := b.selected()
	if err != nil || s.serve == nil {
		return err
	}
	return b.options(s).validate(b)
}

// load reads the files the backend flags name into c, the backend's
// configuration; the local backend reads its own directories.
func (b *backendFlags) load(c *serve.Backend, log *slog.Logger) error {
	s, err := b.selected()
	if err != nil || s.serve == nil {
		return err
	}
	if b.trustAnchors != "" {
		if c.TrustAnchors, err = readCerts(name("trust-anchors"), b.trustAnchors); err != nil {
			return err
		}
	}
	c.ServingCertFile, c.ServingKeyFile = b.servingCert, b.servingKey
	return b.options(s).load(b, c, log)
}

// requireServing refuses a backend meshca holds no CA key of without the
// serving certificate the operator provides.
func (b *backendFlags) requireServing(signer string) error {
	if b.servingCert == "" || b.servingKey == "" {
		return fmt.Errorf("%s and %s are required with the %s signer: meshca holds no CA key to issue its own", name("serving-cert-file"), name("serving-key-file"), signer)
	}
	return nil
}

func readCerts(flag, path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	certs, err := pemutil.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return certs, nil
}

// secret reads a secret from a file or, when no file is given, from an
// environment variable; never from a flag's value.
func secret(flag, file, env string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	return strings.TrimSpace(string(b)), nil
}
