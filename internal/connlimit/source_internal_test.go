package connlimit

import (
	"net"
	"testing"
)

func TestSourceGroupsIPv6By64(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":            "192.0.2.7",
		"::ffff:192.0.2.7":     "192.0.2.7",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1": "2001:db8:1:2::/64",
		"2001:db8:1:3::1":      "2001:db8:1:3::/64",
	} {
		if got := source(&net.TCPAddr{IP: net.ParseIP(in), Port: 9}); got != want {
			t.Errorf("source(%s) = %s, want %s", in, got, want)
		}
	}
}
