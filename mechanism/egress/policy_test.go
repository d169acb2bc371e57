package egress_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
)

func TestParsePolicyRefusesBadEntries(t *testing.T) {
	for _, e := range []string{
		"", "not a domain!", "http://example.com/", "example", "*.", "*", "a..b.com", "-a.com", "a-.com",
		"example.com:0", "example.com:65536", "example.com:http", "1.2.3.4/33", "1.2.3.4:22:1",
		"[2001:db8::1", "[2001:db8::1]x", "example.123", "*.*.example.com", "exa mple.com",
		strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 200) + "com",
	} {
		_, err := egress.ParsePolicy([]string{"ok.example", e})
		if !errors.Is(err, mechanism.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("%q", e)) {
			t.Errorf("ParsePolicy(%q) = %v, want invalid naming the entry", e, err)
		}
	}
}

func TestParsePolicyLimit(t *testing.T) {
	list := make([]string, egress.MaxEntries)
	for i := range list {
		list[i] = fmt.Sprintf("h%d.example.com", i)
	}
	if _, err := egress.ParsePolicy(list); err != nil {
		t.Fatalf("%d entries: %v", len(list), err)
	}
	_, err := egress.ParsePolicy(append(list, "one-more.example.com"))
	if !errors.Is(err, mechanism.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprint(egress.MaxEntries)) {
		t.Fatalf("%d entries = %v, want invalid naming the limit", len(list)+1, err)
	}
}

func TestPolicyMatching(t *testing.T) {
	pol, err := egress.ParsePolicy([]string{"Example.COM.", "*.wild.example:8443", "203.0.113.0/24:443", "2001:db8::/32", "[2001:db8:1::1]:22", "198.51.100.7"})
	if err != nil {
		t.Fatal(err)
	}
	names := []struct {
		name string
		port uint16
		want bool
	}{
		{"example.com", 80, true}, {"EXAMPLE.com.", 443, true}, {"www.example.com", 443, false},
		{"a.wild.example", 8443, true}, {"a.b.wild.example", 8443, true}, {"a.wild.example", 443, false},
		{"wild.example", 8443, false}, {"notwild.example", 8443, false}, {"a.wild.example", 0, true},
	}
	for _, c := range names {
		if got := pol.AllowsName(c.name, c.port); got != c.want {
			t.Errorf("AllowsName(%q, %d) = %v", c.name, c.port, got)
		}
	}
	addrs := []struct {
		addr string
		port uint16
		want bool
	}{
		{"203.0.113.1", 443, true}, {"203.0.113.1", 80, false}, {"203.0.114.1", 443, false},
		{"::ffff:203.0.113.1", 443, true}, {"2001:db8:5::1", 80, true}, {"198.51.100.7", 1, true}, {"198.51.100.8", 1, false},
	}
	for _, c := range addrs {
		if got := pol.AllowsAddr(netip.MustParseAddr(c.addr), c.port); got != c.want {
			t.Errorf("AllowsAddr(%s, %d) = %v", c.addr, c.port, got)
		}
	}
	var none *egress.Policy
	if !none.AllowsName("anything.example", 1) || !none.AllowsAddr(netip.MustParseAddr("198.51.100.1"), 1) {
		t.Errorf("a nil policy allows every public destination")
	}
	empty, _ := egress.ParsePolicy([]string{})
	if empty.AllowsName("example.com", 443) || empty.AllowsAddr(netip.MustParseAddr("198.51.100.7"), 443) {
		t.Errorf("allow [] allowed something")
	}
}
