//go:build !cgo

package jail

// cInitLinked: built without cgo, this binary has only the Go init.
const cInitLinked = false
