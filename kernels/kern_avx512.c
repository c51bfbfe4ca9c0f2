#include "kernels/kern-int.h"

void kern__fill_avx512(kern_table_t *t)
{
    t->isa = KERN_ISA_AVX512;
    t->name = "avx512";
}
