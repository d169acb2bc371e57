package main

import (
	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
)

// Sprites is configured from SPRITES_TOKEN (required) and SPRITES_API_URL;
// asking for it without a token is an error that names SPRITES_TOKEN.
func init() {
	registerProvider("sprites", func() (sandbox.Provider, error) { return sprites.NewFromEnv() })
}
