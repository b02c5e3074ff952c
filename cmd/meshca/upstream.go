package main

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/spf13/pflag"
)

// upstreamKind describes one upstream of the signing intermediate to
// every command, once: its file (upstream_<name>.go) registers it with
// registerUpstream, and serve's --upstream, help, config file keys and
// checks, and `meshca root prepare --upstream`, all come from the
// registered descriptors.
type upstreamKind struct {
	// name is --upstream's value; usage what it is, for its help.
	name, usage string
	// helpGroup titles its flags in serve's help; keyFlags are those the
	// short help names. Its flags are named <name>-..., and their config
	// file keys are in the section camel(<name>) (pkcs11.module,
	// vaultTransit.key).
	helpGroup string
	keyFlags  []string
	// options makes its flags, for serve and for root prepare alike; nil:
	// it has none (self), and opener opens it.
	options func() upstreamOptions
	opener  func() serve.UpstreamOpener
}

// upstreamOptions are an upstream's own flags.
type upstreamOptions interface {
	register(fl *pflag.FlagSet)
	// validate checks them without I/O.
	validate() error
	// opener reads the files they name and returns the upstream as the
	// assembly opens it.
	opener(log *slog.Logger) (serve.UpstreamOpener, error)
}

// upstreamKinds are the registered upstreams, by name.
var upstreamKinds []*upstreamKind

// registerUpstream adds k to the upstreams.
func registerUpstream(k *upstreamKind) {
	upstreamKinds = append(upstreamKinds, k)
	slices.SortStableFunc(upstreamKinds, func(x, y *upstreamKind) int { return strings.Compare(x.name, y.name) })
}

// upstreamNamed is the upstream named name, nil when none is.
func upstreamNamed(name string) *upstreamKind {
	for _, k := range upstreamKinds {
		if k.name == name {
			return k
		}
	}
	return nil
}

// upstreamNames lists the upstreams' names, "a, b or c".
func upstreamNames() string {
	var names []string
	for _, k := range upstreamKinds {
		names = append(names, k.name)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Bounds of the intermediate's settings.
const (
	minIntermediateTTL = time.Minute
	// minRenewAt is the fraction of life left at which the alert
	// MeshcaIntermediateExpiringSoon fires: renewals are due before.
	minRenewAt = 0.25
)

// upstreamFlags select the upstream of the signing intermediate, its
// lifetime and renewal point, with each upstream's own flags.
type upstreamFlags struct {
	name    string
	ttl     time.Duration
	renewAt float64
	opts    map[string]upstreamOptions
}

// register registers --upstream and the intermediate's settings.
func (u *upstreamFlags) register(fl *pflag.FlagSet) {
	var uses []string
	for _, k := range upstreamKinds {
		uses = append(uses, k.usage)
	}
	fl.StringVar(&u.name, "upstream", "", "renew a short-lived signing intermediate, whose key meshca keeps in its CA state, from an upstream that keeps the root's key: "+
		strings.Join(uses, ", ")+"; empty: the CA state's authority signs as it is (docs/upstream.md)")
	u.registerIntermediate(fl)
}

// registerIntermediate registers the intermediate's lifetime and
// renewal point.
func (u *upstreamFlags) registerIntermediate(fl *pflag.FlagSet) {
	u.registerTTL(fl)
	fl.Float64Var(&u.renewAt, "intermediate-renew-at", keymgr.DefaultRenewAt, "fraction of the intermediate's lifetime left when it is renewed, above 0.25 and below 1; the new one signs at once (with --crl, --crl-propagation later)")
}

// registerTTL registers the intermediate's lifetime.
func (u *upstreamFlags) registerTTL(fl *pflag.FlagSet) {
	fl.DurationVar(&u.ttl, "intermediate-ttl", keymgr.DefaultIntermediateTTL, "lifetime of a signing intermediate renewed from --upstream (at least 1m; cut to its root's end); leaves never outlive it")
}

// groups are the help groups of the upstreams' own flags, each
// registering them.
func (u *upstreamFlags) groups() []flagGroup {
	var out []flagGroup
	for _, k := range upstreamKinds {
		if k.options != nil {
			out = append(out, flagGroup{k.helpGroup, k.keyFlags, func(fl *pflag.FlagSet) { u.options(k).register(fl) }})
		}
	}
	return out
}

// registerAll registers every upstream's own flags, ungrouped (root
// prepare).
func (u *upstreamFlags) registerAll(fl *pflag.FlagSet) {
	for _, k := range upstreamKinds {
		if k.options != nil {
			u.options(k).register(fl)
		}
	}
}

// options are the flags of k, made on first use.
func (u *upstreamFlags) options(k *upstreamKind) upstreamOptions {
	if u.opts == nil {
		u.opts = map[string]upstreamOptions{}
	}
	o, ok := u.opts[k.name]
	if !ok {
		o = k.options()
		u.opts[k.name] = o
	}
	return o
}

// selected is the upstream --upstream names: nil for none, or an error
// saying which there are.
func (u *upstreamFlags) selected() (*upstreamKind, error) {
	if u.name == "" {
		return nil, nil
	}
	k := upstreamNamed(u.name)
	if k == nil {
		return nil, fmt.Errorf("--upstream %q is not one of %s", u.name, upstreamNames())
	}
	return k, nil
}

// validate checks the selection without I/O: an upstream renews the
// built-in CA's intermediate in a CA state, with enough of its life left
// at the renewal for a leaf of --default-ttl worth issuing (twice
// signer.MinLifetime: below it, requests and /readyz fail).
func (u *upstreamFlags) validate(signerName string, hasState bool, defaultTTL time.Duration) error {
	k, err := u.selected()
	switch {
	case err != nil || k == nil:
		return err
	case signerName != signerLocal:
		return fmt.Errorf("--upstream %s renews the built-in CA's signing intermediate, and --signer %s signs elsewhere: give one of them (docs/backends.md says which)", u.name, signerName)
	case !hasState:
		return fmt.Errorf("--upstream %s keeps its intermediate in a CA state: give --state-dir or --state-secret (a plugged-in --ca-dir is renewed by its owner)", u.name)
	case u.ttl < minIntermediateTTL:
		return fmt.Errorf("--intermediate-ttl %v must be at least %v", u.ttl, minIntermediateTTL)
	case u.renewAt <= minRenewAt || u.renewAt >= 1:
		return fmt.Errorf("--intermediate-renew-at %v must be above %v (MeshcaIntermediateExpiringSoon fires below it) and below 1", u.renewAt, minRenewAt)
	case time.Duration(float64(u.ttl)*u.renewAt) < 2*signer.MinLifetime(defaultTTL):
		return fmt.Errorf("--intermediate-ttl %v × --intermediate-renew-at %v leaves %v at a renewal; it must leave at least %v for leaves of --default-ttl %v "+
			"(a leaf worth issuing has half its lifetime, at most a minute, and the renewal may take that long again)",
			u.ttl, u.renewAt, time.Duration(float64(u.ttl)*u.renewAt), 2*signer.MinLifetime(defaultTTL), defaultTTL)
	case k.options == nil:
		return nil
	}
	return u.options(k).validate()
}

// config is the assembly's configuration of the selected upstream; nil
// for none.
func (u *upstreamFlags) config(log *slog.Logger) (*serve.Upstream, error) {
	k, err := u.selected()
	if err != nil || k == nil {
		return nil, err
	}
	o, err := k.open(u, log)
	if err != nil {
		return nil, err
	}
	if o.Name() != k.name {
		return nil, errors.New("--upstream " + k.name + ": its opener is named " + o.Name())
	}
	return &serve.Upstream{Opener: o, TTL: u.ttl, RenewAt: u.renewAt}, nil
}

// open is k as the assembly opens it, with its flags in u.
func (k *upstreamKind) open(u *upstreamFlags, log *slog.Logger) (serve.UpstreamOpener, error) {
	if k.options == nil {
		return k.opener(), nil
	}
	return u.options(k).opener(log)
}

// upstreamSection is the config file section of flag, when an upstream
// registers it (its name starts <name>-), and the rest of its name; ok is
// false for a flag of no upstream.
func upstreamSection(flag string) (section, rest string, ok bool) {
	for _, k := range upstreamKinds {
		if k.options == nil || !slices.Contains(k.flagNames(), flag) {
			continue
		}
		if rest, ok := strings.CutPrefix(flag, k.name+"-"); ok {
			return camel(k.name), rest, true
		}
	}
	return "", "", false
}

// flagNames are the names of k's own flags.
func (k *upstreamKind) flagNames() []string {
	fl := pflag.NewFlagSet(k.name, pflag.ContinueOnError)
	k.options().register(fl)
	var names []string
	fl.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	return names
}
