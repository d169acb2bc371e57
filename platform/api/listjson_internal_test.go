package api

import (
	"encoding/json"
	"testing"
	"time"
)

func TestAppendJSONIsEncodingJSON(t *testing.T) {
	now := time.Date(2026, 12, 2, 5, 6, 7, 890123000, time.UTC)
	park := now.Add(time.Hour).In(time.FixedZone("x", 3600))
	for _, v := range []Sandbox{
		{Name: "a", Provider: "local", State: "running", CreatedAt: now, LastActivity: now},
		{Name: "b.c_d-e", Provider: "sprites", State: "parked", Status: "suspended", URL: "https://x.example/?a=1&b=<2>", InstanceID: "i\"d\\\n",
			Limits: &Limits{MemoryBytes: 1 << 30, Pids: 9}, CreatedAt: now, LastActivity: now, ParkedAt: &park, ParkedBy: "suspend",
			Image: "reg.example/o<r>:t", Labels: map[string]string{"team": "ml", "a&b": "<\n>"},
			Capabilities: []string{"suspend", "attach"}, Raw: json.RawMessage(`{"k": [1, 2]}`)},
		{Name: "ü", Provider: "p", State: "s"},
	} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.appendJSON(nil); string(got) != string(want) {
			t.Errorf("appendJSON:\n got %s\nwant %s", got, want)
		}
	}
}
