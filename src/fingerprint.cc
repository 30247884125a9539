#include "idem/fingerprint.h"
