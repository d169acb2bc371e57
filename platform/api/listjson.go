package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// appendJSON appends v as encoding/json would marshal it (the test
// compares the two). Listing 10,000 records through encoding/json's
// reflection took most of the listing's time; this writes the same bytes
// directly.
func (v *Sandbox) appendJSON(b []byte) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, v.Name)
	b = append(b, `,"provider":`...)
	b = appendString(b, v.Provider)
	b = append(b, `,"state":`...)
	b = appendString(b, v.State)
	opt := func(key, s string) {
		if s != "" {
			b = append(b, `,"`+key+`":`...)
			b = appendString(b, s)
		}
	}
	opt("status", v.Status)
	opt("url", v.URL)
	opt("instance_id", v.InstanceID)
	if v.Limits != nil {
		lb, _ := json.Marshal(v.Limits)
		b = append(append(b, `,"limits":`...), lb...)
	}
	b = append(b, `,"created_at":`...)
	b = appendTime(b, v.CreatedAt)
	b = append(b, `,"last_activity_at":`...)
	b = appendTime(b, v.LastActivity)
	if v.ParkedAt != nil {
		b = append(b, `,"parked_at":`...)
		b = appendTime(b, *v.ParkedAt)
	}
	opt("parked_by", v.ParkedBy)
	opt("image", v.Image)
	if len(v.Labels) > 0 {
		lb, _ := json.Marshal(v.Labels)
		b = append(append(b, `,"labels":`...), lb...)
	}
	if len(v.Capabilities) > 0 {
		cb, _ := json.Marshal(v.Capabilities)
		b = append(append(b, `,"capabilities":`...), cb...)
	}
	if len(v.Raw) > 0 {
		rb, _ := json.Marshal(v.Raw)
		b = append(append(b, `,"raw":`...), rb...)
	}
	return append(b, '}')
}

func appendTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		tb, _ := json.Marshal(t)
		return append(b, tb...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendString quotes s; anything encoding/json would escape goes through it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			sb, _ := json.Marshal(s)
			return append(b, sb...)
		}
	}
	return strconv.AppendQuote(b, s)
}

// writeList writes {"data":[...]} of vs.
func writeList(w http.ResponseWriter, vs []Sandbox) {
	b := make([]byte, 0, 64+len(vs)*256)
	b = append(b, `{"data":[`...)
	for i := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = vs[i].appendJSON(b)
	}
	b = append(b, "]}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
