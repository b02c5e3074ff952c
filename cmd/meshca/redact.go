package main

import (
	"net/url"
	"regexp"
	"strings"
)

// redacted replaces a secret in the configuration event.
const redacted = "[redacted]"

// secretFlags hold a value that is half a credential. meshca takes
// secrets from files and environment variables only, so no flag should
// hold one; redact catches those given by mistake.
var secretFlags = map[string]bool{"vault-approle-role-id": true}

var (
	// vaultToken matches Vault's service, batch and recovery tokens.
	vaultToken = regexp.MustCompile(`^(hv[sbr]|[sbr])\.[A-Za-z0-9_-]{20,}$`)
	// opaque matches a long run of base64 or hex: a key or a token, not a
	// path, name or address (those hold '.', ':' or start with '/').
	opaque = regexp.MustCompile(`^[A-Za-z0-9+/=_-]{32,}$`)
)

// redact is the value of flag as the configuration event shows it: as
// it is, unless it is or holds a secret.
func redact(flag, v string) string {
	switch {
	case v == "":
		return v
	case secretFlags[flag], looksSecret(v):
		return redacted
	}
	if strings.Contains(v, "@") {
		if u, err := url.Parse(v); err == nil && u.User != nil {
			return u.Redacted()
		}
	}
	return v
}

// looksSecret reports whether v looks like key material or a token: PEM,
// a JWT, a Vault token, or a long opaque string with digits and letters.
func looksSecret(v string) bool {
	switch {
	case strings.Contains(v, "-----BEGIN"), strings.Contains(v, "PRIVATE KEY"):
		return true
	case strings.HasPrefix(v, "eyJ") && strings.Count(v, ".") == 2:
		return true
	case vaultToken.MatchString(v):
		return true
	}
	return opaque.MatchString(v) && !strings.HasPrefix(v, "/") &&
		strings.ContainsAny(v, "0123456789") && strings.ContainsAny(strings.ToLower(v), "abcdefghijklmnopqrstuvwxyz")
}
