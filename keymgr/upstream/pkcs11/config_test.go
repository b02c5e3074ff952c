package pkcs11

import (
	"bytes"
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	slot, negative := 3, -1
	good := Config{Module: "/m.so", TokenLabel: "meshca", PIN: "1234"}
	tests := []struct {
		name string
		edit func(*Config)
		want string // empty: valid
	}{
		{"by label", func(*Config) {}, ""},
		{"by slot", func(c *Config) { c.TokenLabel, c.Slot = "", &slot }, ""},
		{"no module", func(c *Config) { c.Module = "" }, "the module's path is required"},
		{"no token", func(c *Config) { c.TokenLabel = "" }, "a token label or a slot is required"},
		{"label and slot", func(c *Config) { c.Slot = &slot }, "not both"},
		{"negative slot", func(c *Config) { c.TokenLabel, c.Slot = "", &negative }, "slot -1 is negative"},
		{"no PIN", func(c *Config) { c.PIN = "" }, "the user PIN is required"},
		{"one session", func(c *Config) { c.MaxSessions = 1 }, "at least 2 sessions"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("validate: %v, want %q", err, tc.want)
			case err != nil && strings.Contains(err.Error(), c.PIN) && c.PIN != "":
				t.Fatalf("validate's error %q holds the PIN", err)
			}
		})
	}
}

func TestKeyRef(t *testing.T) {
	k := keyRef{Label: "meshca root 2026-12-06T19:42:00Z", ID: []byte{0x00, 0x3a, 0xff}}
	s := k.String()
	if want := "pkcs11:object=meshca%20root%202026-12-06T19%3A42%3A00Z;id=%00%3a%ff"; s != want {
		t.Fatalf("String() = %q, want %q", s, want)
	}
	back, err := parseKeyRef(s)
	if err != nil || back.Label != k.Label || !bytes.Equal(back.ID, k.ID) {
		t.Fatalf("parseKeyRef(%q) = %+v, %v; want %+v", s, back, err, k)
	}
	for _, bad := range []struct{ ref, want string }{
		{"object=x;id=%01", "is not a pkcs11: URI"},
		{"pkcs11:object=x", "lacks the object's label or ID"},
		{"pkcs11:id=%01", "lacks the object's label or ID"},
		{"pkcs11:object=x;id=%01;token=t", `unknown attribute "token"`},
		{"pkcs11:object=x;object=y;id=%01", "names object twice"},
		{"pkcs11:object=x;id=%zz", "invalid URL escape"},
	} {
		if _, err := parseKeyRef(bad.ref); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("parseKeyRef(%q): %v, want %q", bad.ref, err, bad.want)
		}
	}
}
