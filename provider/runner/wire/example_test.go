package wire_test

import (
	"fmt"

	"github.com/managoat/managoat/provider/runner/wire"
)

// The daemon sends stream frames; the platform decodes them without ever
// reading an exit it did not get.
func ExampleDecode() {
	out := wire.AppendStream(nil, &wire.Stream{Kind: wire.StreamStdout, SessionID: "s1", Data: []byte("hi\n")})
	fmt.Println(string(out))
	f, err := wire.Decode(out)
	fmt.Printf("%q %q %v\n", f.Stream.SessionID, f.Stream.Data, err)

	f, _ = wire.Decode([]byte(`{"stream":"exit","session_id":"s1","code":"oops"}`))
	fmt.Println(f.Stream.Malformed)
	// Output:
	// {"stream":"stdout","session_id":"s1","data":"aGkK"}
	// "s1" "hi\n" <nil>
	// true
}
