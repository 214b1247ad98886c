#include "../kstub.h"
