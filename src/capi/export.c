/* The shared library's own translation unit: every exported symbol comes from
 * the core archive linked whole; this file only anchors the target. */
#include "kvxfer.h"
