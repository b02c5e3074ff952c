package signers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
)

// vaultAudit is Vault's own record of what meshca did with its tokens, read
// from a file audit device: the tokens meshca logged in with, renewed and
// signed with, counted on Vault's side.
type vaultAudit struct {
	path string

	mu     sync.Mutex
	offset int64
	tokens map[string]*tokenUse // by accessor
	order  []string             // accessors in the order Vault first answered with them
	// failedLogins are meshca's logins Vault refused.
	failedLogins int
}

// tokenUse is one Vault token's life as the audit log shows it.
type tokenUse struct {
	accessor string
	// issued is when Vault first handed the token out (a login, or
	// auth/token/create for a token file).
	issued time.Time
	// loggedIn is when meshca first logged in with it (a login, or its
	// lookup-self of a token file), and logins how often it did; a token
	// file's token is taken up again at every login until the file
	// changes.
	loggedIn time.Time
	logins   int
	// jwt is the service-account token of a Kubernetes login, HMACed as
	// Vault's sys/audit-hash does.
	jwt string
	// renewals are meshca's renew-self calls that succeeded, with the TTL
	// Vault granted each.
	renewals []renewal
	// refusedRenewals are those that failed.
	refusedRenewals int
	// signs and refused are pki/sign calls answered and refused; first
	// and last are when the first and the last were answered.
	signs, refused int
	first, last    time.Time
}

type renewal struct {
	at  time.Time
	ttl time.Duration
}

// auditEntry is the part of a response entry of Vault's audit log the
// test reads. Accessors are in clear (hmac_accessor=false); tokens are
// HMACed, and the test never reads them.
type auditEntry struct {
	Type    string    `json:"type"`
	Time    time.Time `json:"time"`
	Error   string    `json:"error"`
	Request struct {
		Path     string `json:"path"`
		Accessor string `json:"client_token_accessor"`
		Data     struct {
			JWT string `json:"jwt"` // a Kubernetes login's, HMACed
		} `json:"data"`
	} `json:"request"`
	Response struct {
		Auth *struct {
			Accessor string `json:"accessor"`
			TTL      int64  `json:"token_ttl"`
		} `json:"auth"`
	} `json:"response"`
}

// enableAudit turns on a file audit device with accessors in clear.
func enableAudit(t *testing.T, v *harness.Vault) *vaultAudit {
	t.Helper()
	a := &vaultAudit{path: filepath.Join(t.TempDir(), "audit.log"), tokens: map[string]*tokenUse{}}
	err := v.Client.Sys().EnableAuditWithOptionsWithContext(context.Background(), "file", &api.EnableAuditOptions{
		Type: "file", Options: map[string]string{"file_path": a.path, "hmac_accessor": "false"},
	})
	if err != nil {
		t.Fatalf("enable Vault's audit device: %v", err)
	}
	return a
}

// loginPaths are the paths of meshca's logins: AppRole, Kubernetes, and
// the lookup-self with which a token file's token is taken up.
var loginPaths = []string{"auth/approle/login", "auth/kubernetes/login", "auth/token/lookup-self"}

// auditView is what the audit log showed so far: the tokens meshca used,
// in the order Vault handed them out, and the logins Vault refused.
type auditView struct {
	tokens       []tokenUse
	failedLogins int
}

// read takes in the entries written since the last read.
func (a *vaultAudit) read() (auditView, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, err := os.Open(a.path)
	if err != nil {
		return auditView{}, err
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, 0); err != nil {
		return auditView{}, err
	}
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil { // a line not written whole yet is read next time
			break
		}
		a.offset += int64(len(line))
		var e auditEntry
		if err := json.Unmarshal(line, &e); err != nil {
			return auditView{}, fmt.Errorf("audit log: %w", err)
		}
		if e.Type == "response" {
			a.add(&e)
		}
	}
	view := auditView{failedLogins: a.failedLogins}
	for _, acc := range a.order {
		if u := a.tokens[acc]; u.logins > 0 {
			c := *u
			c.renewals = slices.Clone(u.renewals)
			view.tokens = append(view.tokens, c)
		}
	}
	return view, nil
}

func (u *tokenUse) login(at time.Time) {
	if u.logins == 0 {
		u.loggedIn = at
	}
	u.logins++
}

// token is the record of accessor, new if Vault had not named it yet.
func (a *vaultAudit) token(accessor string, at time.Time) *tokenUse {
	u, ok := a.tokens[accessor]
	if !ok {
		u = &tokenUse{accessor: accessor, issued: at}
		a.tokens[accessor] = u
		a.order = append(a.order, accessor)
	}
	return u
}

func (a *vaultAudit) add(e *auditEntry) {
	if e.Error == "" && e.Response.Auth != nil && e.Response.Auth.Accessor != "" {
		a.token(e.Response.Auth.Accessor, e.Time) // a login or a token created
	}
	p := e.Request.Path
	switch {
	case e.Error != "" && slices.Contains(loginPaths, p):
		a.failedLogins++
		return
	case p == "auth/token/lookup-self":
		a.token(e.Request.Accessor, e.Time).login(e.Time)
		return
	case slices.Contains(loginPaths, p) && e.Response.Auth != nil:
		// A login sends the token it replaces, if any: the login is the
		// token it answers with.
		u := a.token(e.Response.Auth.Accessor, e.Time)
		u.login(e.Time)
		u.jwt = e.Request.Data.JWT
		return
	case e.Request.Accessor == "":
		return
	}
	u := a.token(e.Request.Accessor, e.Time)
	switch {
	case p == "auth/token/renew-self" && e.Error == "" && e.Response.Auth != nil:
		u.renewals = append(u.renewals, renewal{at: e.Time, ttl: time.Duration(e.Response.Auth.TTL) * time.Second})
	case p == "auth/token/renew-self":
		u.refusedRenewals++
	case strings.HasPrefix(p, "pki/sign/") && e.Error != "":
		u.refused++
	case strings.HasPrefix(p, "pki/sign/"):
		if u.signs == 0 {
			u.first = e.Time
		}
		u.signs++
		u.last = e.Time
	}
}

// summary describes one token's life for the report: how long after its
// issue it signed, and how often it was renewed.
func (u tokenUse) summary() string {
	var ttls []string
	for _, r := range u.renewals {
		ttls = append(ttls, fmt.Sprint(r.ttl.Seconds()))
	}
	return fmt.Sprintf("taken up in %d logins, signed %d (refused %d) from %.1fs to %.1fs after its issue, renewed %d times (TTLs granted %s s; %d refused)",
		u.logins, u.signs, u.refused, u.first.Sub(u.issued).Seconds(), u.last.Sub(u.issued).Seconds(), len(u.renewals),
		strings.Join(ttls, ","), u.refusedRenewals)
}
