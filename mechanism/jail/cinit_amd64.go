package jail

import _ "embed"

// standaloneInitELF is the standalone C init (cinit.c over cinit_rt.c, no
// C library), built by gencinit.sh.
//
//go:generate sh gencinit.sh
//go:embed cinit_amd64.elf
var standaloneInitELF []byte
