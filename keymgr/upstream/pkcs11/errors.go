//go:build pkcs11

package pkcs11

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/miekg/pkcs11"
)

// errKeyNotFound: no private key in the token has the Ref's label and ID.
// Before the token logged in, its private objects are invisible too, so
// the lookup is tried once more on a new login before this is final.
var errKeyNotFound = errors.New("no private key with this label and ID in the token")

// A keyError is a key the upstream refuses to use or make: not the
// root's, extractable, of a type the token does not make.
type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }

// staleCodes are the return codes after which a new login may succeed:
// the login or the sessions are gone, or the token came back.
var staleCodes = map[pkcs11.Error]bool{
	pkcs11.CKR_USER_NOT_LOGGED_IN:       true,
	pkcs11.CKR_SESSION_HANDLE_INVALID:   true,
	pkcs11.CKR_SESSION_CLOSED:           true,
	pkcs11.CKR_OBJECT_HANDLE_INVALID:    true,
	pkcs11.CKR_KEY_HANDLE_INVALID:       true,
	pkcs11.CKR_TOKEN_NOT_PRESENT:        true,
	pkcs11.CKR_TOKEN_NOT_RECOGNIZED:     true,
	pkcs11.CKR_DEVICE_REMOVED:           true,
	pkcs11.CKR_DEVICE_ERROR:             true,
	pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED: true,
}

// pinCodes are the login failures that a retry with the same PIN cannot
// cure and that a token counts towards locking its user PIN: after one,
// the upstream logs in no more until it is made anew with a new PIN.
var pinCodes = map[pkcs11.Error]bool{
	pkcs11.CKR_PIN_INCORRECT:            true,
	pkcs11.CKR_PIN_INVALID:              true,
	pkcs11.CKR_PIN_LEN_RANGE:            true,
	pkcs11.CKR_PIN_EXPIRED:              true,
	pkcs11.CKR_PIN_LOCKED:               true,
	pkcs11.CKR_USER_PIN_NOT_INITIALIZED: true,
}

// pinError reports whether err is one of pinCodes.
func pinError(err error) bool {
	var code pkcs11.Error
	return errors.As(err, &code) && pinCodes[code]
}

// stale reports whether err may be cured by logging in anew.
func stale(err error) bool {
	var code pkcs11.Error
	return errors.Is(err, errKeyNotFound) || errors.As(err, &code) && staleCodes[code]
}

// refusedCodes are the return codes that need an operator: a PIN, a
// mechanism or key type the token lacks, a read-only token (and
// pinCodes).
var refusedCodes = map[pkcs11.Error]bool{
	pkcs11.CKR_MECHANISM_INVALID:          true,
	pkcs11.CKR_MECHANISM_PARAM_INVALID:    true,
	pkcs11.CKR_KEY_TYPE_INCONSISTENT:      true,
	pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED: true,
	pkcs11.CKR_ATTRIBUTE_VALUE_INVALID:    true,
	pkcs11.CKR_TEMPLATE_INCONSISTENT:      true,
	pkcs11.CKR_TOKEN_WRITE_PROTECTED:      true,
	pkcs11.CKR_CURVE_NOT_SUPPORTED:        true,
}

// unavailableCodes are the return codes worth retrying later: the token
// is away, busy or out of room for sessions.
var unavailableCodes = map[pkcs11.Error]bool{
	pkcs11.CKR_TOKEN_NOT_PRESENT:        true,
	pkcs11.CKR_TOKEN_NOT_RECOGNIZED:     true,
	pkcs11.CKR_DEVICE_REMOVED:           true,
	pkcs11.CKR_DEVICE_ERROR:             true,
	pkcs11.CKR_DEVICE_MEMORY:            true,
	pkcs11.CKR_SESSION_COUNT:            true,
	pkcs11.CKR_FUNCTION_CANCELED:        true,
	pkcs11.CKR_USER_NOT_LOGGED_IN:       true,
	pkcs11.CKR_SESSION_HANDLE_INVALID:   true,
	pkcs11.CKR_SESSION_CLOSED:           true,
	pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED: true,
}

// token names c's token for messages: never the PIN.
func (c *Config) token() string {
	if c.Slot != nil {
		return fmt.Sprintf("slot %d", *c.Slot)
	}
	return fmt.Sprintf("token %q", c.TokenLabel)
}

// classify wraps err, from an operation on what the upstream calls
// what, as an *upstream.Error of the kind the renewer retries by, naming
// the token and module, and what an operator can do.
func (u *Upstream) classify(what string, err error) error {
	if err == nil {
		return nil
	}
	var ue *upstream.Error
	if errors.As(err, &ue) {
		return err
	}
	kind, hint := upstream.KindInternal, ""
	var code pkcs11.Error
	var ke *keyError
	var oe *openError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		kind = upstream.KindUnavailable
	case pinError(err):
		kind, hint = upstream.KindRefused, "the token refused the PIN; meshca will not try it again until it restarts with another"
	case errors.As(err, &code) && refusedCodes[code]:
		kind = upstream.KindRefused
	case errors.As(err, &code) && unavailableCodes[code]:
		kind = upstream.KindUnavailable
	case errors.Is(err, errKeyNotFound), errors.As(err, &ke):
		kind = upstream.KindRefused
	case errors.As(err, &oe) && strings.Contains(err.Error(), "failed to open module"):
		// dlopen failed: the module's path or its libraries are wrong.
		kind, hint = upstream.KindRefused, "the module, or a library it needs (ldd lists them), is missing or not for this machine"
	case errors.As(err, &oe) && strings.Contains(err.Error(), "could not find PKCS#11 token"):
		// A network HSM away, a token not yet inserted, or a wrong label.
		kind, hint = upstream.KindUnavailable, "no slot of the module holds it (pkcs11-tool --module <module> --list-slots)"
	case errors.As(err, &oe):
		kind = upstream.KindUnavailable
	case strings.Contains(err.Error(), "pool"), strings.Contains(err.Error(), "context is closed"):
		kind = upstream.KindUnavailable
	}
	err = fmt.Errorf("%s of module %s: %s: %w", u.cfg.token(), u.cfg.Module, what, err)
	if hint != "" {
		err = fmt.Errorf("%w (%s)", err, hint)
	}
	return &upstream.Error{Upstream: Name, Kind: kind, Err: err}
}
