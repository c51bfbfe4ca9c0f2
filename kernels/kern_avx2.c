#include "kernels/kern-int.h"

void kern__fill_avx2(kern_table_t *t)
{
    t->isa = KERN_ISA_AVX2;
    t->name = "avx2";
}
