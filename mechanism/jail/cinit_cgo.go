//go:build cgo

package jail

// The C init (cinit.c) is linked into every cgo binary that imports this
// package; its constructor runs before the Go runtime and takes over a
// process started with the helper variable set to "cinit".

// #cgo CFLAGS: -O2 -Wall -Wextra -Wno-unused-parameter
import "C"

// cInitLinked: this binary carries the C init.
const cInitLinked = true
